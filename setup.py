"""Packaging that pyproject.toml cannot say: the top-level ``configs/`` ships inside the wheel
as ``harness/configs/`` (:data:`harness.config.CONFIG_DIR` finds it there), so a non-editable
install composes its configs from any folder. Every folder of ``configs/`` is named as a
package of ``harness.configs`` mapped onto ``configs/``, so that setuptools copies its YAML
files as package data (and puts them in the sdist) without warning about unlisted folders.
``hydra_plugins/harness_ray_launcher`` joins Hydra's ``hydra_plugins`` namespace (the Ray
launcher: Hydra takes launchers from there only). The robot files the harness brings
(``envs/robot/assets``, ``env.asset=harness:NAME``) ship as that package's data."""

from setuptools import find_namespace_packages, setup

config_groups = ["harness.configs", *(f"harness.configs.{name}" for name in find_namespace_packages(where="configs"))]

setup(
    packages=[
        *find_namespace_packages(include=["harness", "harness.*", "envs", "envs.*", "hydra_plugins.harness_*"]),
        *config_groups,
    ],
    package_dir={"harness.configs": "configs"},
    package_data={**{name: ["*.yaml"] for name in config_groups}, "envs.robot.assets": ["*.xml"]},
)
