"""pyproject.toml builds without setuptools' deprecation warnings, and the wheel carries its licence."""
import warnings

import pytest


def test_project_metadata_reads_without_warnings_and_names_the_license(repo_root, monkeypatch):
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(repo_root)                   # license-files are globbed from the project folder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), "pyproject.toml")
    assert [str(w.message).splitlines()[0] for w in caught] == [], setuptools.__version__
    assert dist.metadata.license_expression == "Apache-2.0"
    assert dist.metadata.license_files == ["LICENSE"]
    assert "Apache License" in (repo_root / "LICENSE").read_text()
