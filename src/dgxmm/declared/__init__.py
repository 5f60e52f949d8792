"""Deployments declared in files (docs/configuration.md, "Deployments in files"): read and
checked (``parse``), compared with the deployments as they are (``plan``, pure), applied through
the deployer (``apply``), watched (``watch``) and printed back as TOML (``export``)."""
