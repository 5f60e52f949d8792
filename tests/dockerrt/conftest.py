"""Fixtures of the docker runtime tests (a real dockerd, shared by the whole session)."""

from dockerrt.dockerd import docker_env  # noqa: F401 (a fixture)
