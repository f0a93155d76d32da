"""Builds the package `sparse_mla` (python/sparse_mla) and its extension
`sparse_mla._native` through the project's CMake (python/CMakeLists.txt):
configure the preset that SPARSE_MLA_BACKEND names (host, the default; cuda;
hip) into build/python-<backend> for the interpreter running this script,
build the one target, copy the extension where setuptools packs it beside the
package's Python modules. The cuda and hip presets build Kokkos with the
project where no installed Kokkos has the backend (docs/GPU.md), so

    SPARSE_MLA_BACKEND=cuda pip install --no-build-isolation .

gives the CUDA module. Extra CMake arguments: SPARSE_MLA_CMAKE_ARGS (the GPU:
"-DSPARSE_MLA_CUDA_ARCH=sm_80"); SPARSE_MLA_BUILD_TYPE (Release)."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
BACKENDS = ("host", "cuda", "hip")  # presets of CMakePresets.json
BACKEND = os.environ.get("SPARSE_MLA_BACKEND", "host") or "host"
if BACKEND not in BACKENDS:
    raise SystemExit(f"SPARSE_MLA_BACKEND is '{BACKEND}': one of {', '.join(BACKENDS)}")
BUILD = ROOT / "build" / f"python-{BACKEND}"


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        config = os.environ.get("SPARSE_MLA_BUILD_TYPE", "Release")
        # The preset's settings; a user's build, not CI's: warnings are not errors.
        args = [
            "cmake", "--preset", BACKEND, "-S", str(ROOT), "-B", str(BUILD),
            f"-DCMAKE_BUILD_TYPE={config}",
            f"-DSPARSE_MLA_PYTHON={sys.executable}",
            "-DSPARSE_MLA_BUILD_PYTHON=ON",
            "-DSPARSE_MLA_BUILD_TESTS=OFF",
            "-DSPARSE_MLA_BUILD_TOOLS=OFF",
            "-DSPARSE_MLA_WERROR=OFF",
        ]
        if not shutil.which("ninja") and not (BUILD / "CMakeCache.txt").exists():
            args += ["-G", "Unix Makefiles"]  # the presets' generator is Ninja
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
