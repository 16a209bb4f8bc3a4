"""Packaging beyond what pyproject.toml can say: the repository's `migrations/` ships inside the
package as `service.migrations`, so an installed wheel can migrate a database (service/store/db.py)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["service", "service.*"]), "service.migrations"],
    package_dir={"service.migrations": "migrations"},
    package_data={"service.migrations": ["script.py.mako", "versions/*.py"]},
)
