"""How `pip install ./python` builds the wheel (the rest is pyproject.toml's).

Nothing is written into the source tree: setuptools' build folder and
egg-info go to a temporary folder. Nothing about the tree is written
into the package either: the library is found at run time
(dragon_bdh/_lib.py). What the wheel may carry is a copy of the library
itself, dragon_bdh/_libs/libdragon.so, when one is found at build time:
$DRAGON_LIB (the file or its folder), else the build folders of the tree
this file is in (build, build-test, build-gpu: the newest library there);
the wheel is then tagged for this platform. Without one the wheel is pure
Python and the library is looked for at run time ($DRAGON_LIB, an
installed libdragon).
"""
import atexit
import os
import shutil
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NAMES = ("libdragon.so", "libdragon.so.0", "libdragon.dylib")


def _in(where):
    if os.path.isfile(where):
        return os.path.realpath(where)
    for n in NAMES:
        p = os.path.join(where, n)
        if os.path.isfile(p):
            return os.path.realpath(p)
    return None


def find_library():
    """The libdragon to bundle, or None."""
    env = os.environ.get("DRAGON_LIB")
    if env:
        return _in(env)
    found = [p for p in (_in(os.path.join(ROOT, b)) for b in ("build", "build-test", "build-gpu")) if p]
    return max(found, key=os.path.getmtime) if found else None


LIB = find_library()


class BuildPy(build_py):
    def run(self):
        super().run()
        if not LIB:
            print("dragon-bdh: no libdragon found to bundle (DRAGON_LIB, %s/build): the package will look for "
                  "one at run time" % ROOT, file=sys.stderr)
            return
        out = os.path.join(self.build_lib, "dragon_bdh", "_libs")
        os.makedirs(out, exist_ok=True)
        shutil.copyfile(LIB, os.path.join(out, "libdragon.so"))
        print("dragon-bdh: bundled %s" % LIB, file=sys.stderr)


class Dist(Distribution):
    def has_ext_modules(self):  # a bundled library makes the wheel this platform's
        return LIB is not None


_tmp = tempfile.mkdtemp(prefix="dragon-bdh-build-")
atexit.register(shutil.rmtree, _tmp, True)
setup(cmdclass={"build_py": BuildPy}, distclass=Dist,
      options={"build": {"build_base": os.path.join(_tmp, "build")},
               "egg_info": {"egg_base": _tmp}})
