"""The package as pip installs it: its name (dragon_bdh, the old `dragon`
no longer installed), the message without torch, a wheel built without
writing into the source tree and without the tree's path in it, the
library it bundles found at run time, docstrings on every public name."""
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import dragon_bdh

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
ROOT = os.path.dirname(PKG)


def run_py(code, cwd=None, **env):
    e = dict(os.environ)
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=cwd,
                          timeout=300)


def test_the_import_name_is_dragon_bdh_and_dragon_is_not_installed():
    """The package is dragon_bdh (distribution dragon-bdh); nothing named
    `dragon` is installed beside it (HPE's dragonhpc installs a top-level
    `dragon`), and its doc says how the old imports read now."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(dragon_bdh.__file__)))
    assert os.path.basename(os.path.dirname(os.path.abspath(dragon_bdh.__file__))) == "dragon_bdh"
    assert not os.path.exists(os.path.join(here, "dragon")) and not os.path.exists(os.path.join(here, "dragon.py"))
    spec = importlib.util.find_spec("dragon")
    assert spec is None or not (spec.origin or "").startswith(here + os.sep)
    assert "import dragon_bdh` where `import dragon` was" in " ".join(dragon_bdh.__doc__.split())


def test_without_torch_the_message_says_pip_install_torch():
    """`import dragon_bdh` needs no torch; `import dragon_bdh.torch`
    without it is a ModuleNotFoundError (name 'torch') saying to pip
    install torch, not a bare one."""
    r = run_py("import sys; sys.modules['torch'] = None\n"
               "import dragon_bdh\n"
               "try:\n    import dragon_bdh.torch\n"
               "except ModuleNotFoundError as e:\n    print(e.name); print(e)\n")
    assert r.returncode == 0, r.stderr
    name, msg = r.stdout.split("\n", 1)
    assert name == "torch"
    assert "dragon_bdh.torch needs PyTorch" in msg and "pip install torch" in msg


def test_every_public_name_has_a_docstring():
    """Every module, class, function and method a user reaches (names
    without a leading underscore) says what it is."""
    import dragon_bdh.torch
    import dragon_bdh.torch.bdh
    import dragon_bdh.torch.ops

    missing = []
    for mod in (dragon_bdh, dragon_bdh.torch, dragon_bdh.torch.ops, dragon_bdh.torch.bdh):
        if not (mod.__doc__ or "").strip():
            missing.append(mod.__name__)
        for name, obj in vars(mod).items():
            if name.startswith("_") or inspect.ismodule(obj):
                continue
            if not (inspect.isclass(obj) or inspect.isfunction(obj) or callable(obj)):
                continue
            if getattr(obj, "__module__", "").split(".")[0] != "dragon_bdh":
                continue
            if not (getattr(obj, "__doc__", None) or "").strip():
                missing.append("%s.%s" % (mod.__name__, name))
            if inspect.isclass(obj):
                for m, f in vars(obj).items():
                    if m.startswith("_") or not (inspect.isfunction(f) or isinstance(f, (property, classmethod,
                                                                                           staticmethod))):
                        continue
                    f = f.__func__ if isinstance(f, (classmethod, staticmethod)) else f
                    if not (f.__doc__ or "").strip():
                        missing.append("%s.%s.%s" % (mod.__name__, name, m))
    assert not missing, missing


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="no setuptools to build a wheel with")
def test_the_wheel_builds_out_of_tree_and_finds_its_library(tmp_path):
    """pip builds the wheel of a copy of python/ (DRAGON_LIB naming the
    library to bundle) without writing a file into it; the wheel holds
    dragon_bdh and its bundled libdragon, no `dragon` and no path of the
    tree; installed elsewhere and imported from another folder without
    DRAGON_LIB, the package loads its bundled copy. A wheel built without
    a library is pure Python and says where it looked when it has none."""
    src = tmp_path / "src" / "python"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))

    def files():
        return sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)

    before = files()
    lib = dragon_bdh.library_path()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(tmp_path / "wheels"), str(src)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, DRAGON_LIB=lib))
    assert r.returncode == 0, r.stderr
    assert files() == before  # no build/, no egg-info
    (whl,) = os.listdir(tmp_path / "wheels")
    assert "-none-any" not in whl  # a bundled library: this platform's wheel
    with zipfile.ZipFile(tmp_path / "wheels" / whl) as z:
        names = z.namelist()
        assert "dragon_bdh/_libs/libdragon.so" in names and "dragon_bdh/torch/bdh.py" in names
        assert not [n for n in names if n.split("/")[0] in ("dragon", "dragon.py")], names
        for n in names:
            if n.endswith(".py") or n.endswith(".txt"):
                text = z.read(n).decode()
                assert str(src) not in text and ROOT not in text, n
        z.extractall(tmp_path / "site")
    code = "import dragon_bdh; print(dragon_bdh.library_path()); print(dragon_bdh.device_count() >= 0)"
    r = run_py(code, cwd=str(tmp_path), PYTHONPATH=str(tmp_path / "site"), DRAGON_LIB=None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == str(tmp_path / "site" / "dragon_bdh" / "_libs" / "libdragon.so")

    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(tmp_path / "pure"), str(src)],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, DRAGON_LIB=str(tmp_path / "none")))
    assert r.returncode == 0, r.stderr
    (whl,) = os.listdir(tmp_path / "pure")
    assert whl.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(tmp_path / "pure" / whl) as z:
        assert not [n for n in z.namelist() if "_libs" in n]
        z.extractall(tmp_path / "pure-site")
    r = run_py("import dragon_bdh; dragon_bdh.device_count()", cwd=str(tmp_path),
               PYTHONPATH=str(tmp_path / "pure-site"), DRAGON_LIB=None, LD_LIBRARY_PATH="/nonexistent",
               PKG_CONFIG_PATH="/nonexistent", PKG_CONFIG_LIBDIR="/nonexistent")
    if r.returncode == 0:
        pytest.skip("a libdragon is installed on this machine (%s)" % r.stdout)
    assert "libdragon not found; set DRAGON_LIB" in r.stderr and "bundled copy" in r.stderr, r.stderr
