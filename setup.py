# Builds torchtpu._C against the installed torch. Install with
#   pip install --no-build-isolation -e .
# (build isolation would download another, multi-GB torch).
import glob
import os
import shutil

# Building must not load the (possibly stale) extension it is about to replace: torch autoloads torchtpu.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import numpy
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
sources = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True))

if shutil.which("ccache") and "CXX" not in os.environ:
    os.environ["CXX"] = "ccache c++"

setup(
    ext_modules=[
        CppExtension(
            "torchtpu._C",
            sources,
            include_dirs=[os.path.join(ROOT, "csrc"), numpy.get_include()],
            extra_compile_args=["-O2", "-std=c++17", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
