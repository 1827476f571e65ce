"""A kernel configuration: an implementation name plus its parameters, frozen, hashable, JSON-able.

Parameters are kept as a tuple of (name, value) pairs sorted by name, so two configs built from the
same parameters in any order are equal, hash alike and print alike (the string is a tie-breaker and
part of the timing cache, so it must be stable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

Scalar = int | float | str | bool | None
_SCALARS = (int, float, str, bool, type(None))


@dataclass(frozen=True)
class Config:
    impl: str
    params: tuple[tuple[str, Scalar], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.impl, str) or not self.impl:
            raise ValueError(f"config impl must be a non-empty string, got {self.impl!r}")
        params = dict(self.params)
        if len(params) != len(self.params):
            raise ValueError(f"config {self.impl}: a parameter is given twice")
        for name, value in params.items():
            if not isinstance(name, str) or not isinstance(value, _SCALARS):
                raise ValueError(f"config {self.impl}: parameter {name!r} must be a JSON scalar, got {type(value).__name__}")
        object.__setattr__(self, "params", tuple(sorted(params.items())))

    @classmethod
    def of(cls, impl: str, **params: Scalar) -> Config:
        return cls(impl, tuple(params.items()))

    def param(self, name: str, default: Scalar = None) -> Scalar:
        return dict(self.params).get(name, default)

    def kwargs(self) -> dict[str, Scalar]:
        return dict(self.params)

    def __str__(self) -> str:
        if not self.params:
            return self.impl
        return f"{self.impl}(" + ",".join(f"{name}={value}" for name, value in self.params) + ")"

    def to_json(self) -> dict[str, Any]:
        return {"impl": self.impl, "params": dict(self.params)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Config:
        """Raises ValueError naming the bad field; callers add the file name."""
        if not isinstance(data, Mapping) or not isinstance(data.get("impl"), str):
            raise ValueError("config: 'impl' must be a string")
        params = data.get("params", {})
        if not isinstance(params, Mapping):
            raise ValueError(f"config {data['impl']}: 'params' must be an object")
        return cls(data["impl"], tuple(params.items()))
