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


def test_the_wheel_ships_the_configs_and_the_engine_ui(repo_root, tmp_path):
    """An installed dociq trains with the Hydra configs inside the package and serves the engine's
    page: both are package data, and every config file of the source tree is in the wheel."""
    import subprocess
    import sys
    import zipfile

    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path), str(repo_root)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("dociq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"dociq/configs/{p.relative_to(repo_root / 'dociq' / 'configs').as_posix()}"
               for p in (repo_root / "dociq" / "configs").rglob("*.yaml")}
    assert "dociq/configs/train.yaml" in configs and configs <= names, sorted(configs - names)[:5]
    assert {"dociq/engine/static/index.html", "dociq/engine/static/app.js"} <= names


def test_the_configs_folder_at_the_root_is_the_packages_own(repo_root):
    from dociq.training.config import CONFIG_DIR

    assert CONFIG_DIR == repo_root / "dociq" / "configs"
    assert (repo_root / "configs").resolve() == CONFIG_DIR.resolve()
    assert (CONFIG_DIR / "train.yaml").is_file()
