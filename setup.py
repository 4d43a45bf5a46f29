"""Builds gradguard's Python module with CMake for the interpreter that runs pip.

`pip install --no-build-isolation .` (or `python3 -m pip wheel --no-build-isolation .`)
configures the repository with -DGRADGUARD_PYTHON_EXECUTABLE=<this interpreter>, so the
extension links that interpreter's torch, builds the `gradguard_python` target and
packages build/python/gradguard/ (the extension and the pure-Python files).

GRADGUARD_BUILD_DIR=<dir> uses an existing build directory instead of configuring one:
its module must have been built for an interpreter with this one's torch (the same
Python version and torch; e.g. Debian's /usr/bin/python3 for a virtual environment made
with --system-site-packages). CMAKE_ARGS adds options to the configure step.
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("GRADGUARD_BUILD_DIR")
        if build_dir:
            build_dir = os.path.abspath(build_dir)
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                sys.exit("GRADGUARD_BUILD_DIR=%s is not a CMake build directory" % build_dir)
        else:
            build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
            os.makedirs(build_dir, exist_ok=True)
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            configure = ["cmake", "-S", ROOT, "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
                         "-DGRADGUARD_BUILD_TESTS=OFF", "-DGRADGUARD_BUILD_PYTHON=ON",
                         "-DGRADGUARD_PYTHON_EXECUTABLE=" + sys.executable,
                         *shlex.split(os.environ.get("CMAKE_ARGS", ""))]
            subprocess.check_call(configure)
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "gradguard_python", "-j", jobs])
        package = os.path.join(build_dir, "python", "gradguard")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(package, "_C" + suffix)
        if not os.path.exists(built):
            sys.exit("%s was not built: the build directory's module is for another Python (this one needs "
                     "_C%s); configure it with -DGRADGUARD_PYTHON_EXECUTABLE=%s" % (built, suffix, sys.executable))
        out = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(package):
            if name.endswith(".py") or name == "_C" + suffix:
                shutil.copy2(os.path.join(package, name), os.path.join(out, name))


setup(
    packages=["gradguard"],
    package_dir={"gradguard": "python/gradguard"},
    ext_modules=[Extension("gradguard._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own staging stays inside the git-ignored build/ of the repository.
    options={"build": {"build_base": os.path.join("build", "pip")}, "egg_info": {"egg_base": os.path.join("build", "pip")}},
    zip_safe=False,
)
