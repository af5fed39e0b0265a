"""Rebuilding an optimizer created before ``prepare`` on the sharded parameters: accel-core's, announced as
accel-fsdp."""

from __future__ import annotations

from accel_core.optimizer_rebuild import ParameterNames, clean_name, rebuild

__all__ = ["ParameterNames", "clean_name", "rebuild"]
