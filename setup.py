"""Builds the package `sparse_mla` (python/sparse_mla) and its extension
`sparse_mla._native` through the project's CMake (python/CMakeLists.txt):
configure into build/python-package with the interpreter running this script,
build the one target, copy the extension where setuptools packs it beside the
package's Python modules. Extra CMake arguments: SPARSE_MLA_CMAKE_ARGS."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
BUILD = ROOT / "build" / "python-package"


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        config = os.environ.get("SPARSE_MLA_BUILD_TYPE", "Release")
        args = [
            "cmake", "-S", str(ROOT), "-B", str(BUILD),
            f"-DCMAKE_BUILD_TYPE={config}",
            f"-DSPARSE_MLA_PYTHON={sys.executable}",
            "-DSPARSE_MLA_BUILD_PYTHON=ON",
            "-DSPARSE_MLA_BUILD_TESTS=OFF",
            "-DSPARSE_MLA_BUILD_TOOLS=OFF",
        ]
        if shutil.which("ninja") and not (BUILD / "CMakeCache.txt").exists():
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("SPARSE_MLA_CMAKE_ARGS", ""))
        subprocess.run(args, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", str(BUILD), "--target", "sparse_mla_python", "-j", jobs], check=True)
        package = BUILD / "python" / "sparse_mla"
        built = sorted(package.glob("_native*.so")) + sorted(package.glob("_native*.pyd"))
        if not built:
            raise RuntimeError("CMake built no sparse_mla extension: look for 'Python module skipped' in its output above")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


(BUILD / "egg-info").mkdir(parents=True, exist_ok=True)
setup(
    ext_modules=[CMakeExtension("sparse_mla._native")],
    packages=["sparse_mla"],  # named, so that nothing is discovered over core/, cmake/, ...
    package_dir={"sparse_mla": "python/sparse_mla"},
    py_modules=[],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own files go under the CMake build folder too, not into build/ beside the presets.
    options={"egg_info": {"egg_base": str((BUILD / "egg-info").relative_to(ROOT))},
             "build": {"build_base": str((BUILD / "setuptools").relative_to(ROOT))}},
    zip_safe=False,
)
