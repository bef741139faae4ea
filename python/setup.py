"""Records, at install time, where this source tree's library is built
(dragon/_build_info.py), so an installed package finds a build folder of
the tree it came from when no DRAGON_LIB and no installed libdragon say
otherwise. Everything else is pyproject.toml's."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class BuildPy(build_py):
    def run(self):
        super().run()
        out = os.path.join(self.build_lib, "dragon", "_build_info.py")
        with open(out, "w") as f:
            f.write("# written by setup.py at install time\n")
            f.write("SOURCE_ROOT = %r\n" % ROOT)


setup(cmdclass={"build_py": BuildPy})
