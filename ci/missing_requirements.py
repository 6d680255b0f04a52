"""Prints the requirements of installed flashcore's extras (pyproject.toml's
[project.optional-dependencies]) whose packages are not installed at all, one per line.

ci/install.sh installs what this prints: what the tests need gets into the user's environment,
while a package the user already has stays at the version they have (no pin, no upgrade; a
version the tests do not support makes those tests skip or warn, saying so).

Usage: python ci/missing_requirements.py test [bench ...]   (after `pip install .`)
"""
import re
import sys
from importlib import metadata


def missing(extras):
    out = []
    for req in metadata.requires("flashcore") or []:
        spec, _, marker = req.partition(";")
        wanted = re.findall(r'extra\s*==\s*["\']([^"\']+)["\']', marker)
        if not wanted or not set(wanted) & set(extras):
            continue  # a core dependency (torch: ci/install.sh handles it) or another extra
        name = re.match(r"[A-Za-z0-9_.\-]+", spec.strip()).group(0)
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(spec.strip().replace(" ", ""))
    return out


if __name__ == "__main__":
    print("\n".join(missing(sys.argv[1:])))
