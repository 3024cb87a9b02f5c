"""Checked records: a ``typing.NamedTuple`` whose fields are checked whenever one is built.

The package's records (keys, configurations, settings) are NamedTuples: immutable, hashable,
picklable, and cheap to define, which a process importing the package pays for each class
(a frozen dataclass's class costs several times as much to create and imports ``inspect``).
A NamedTuple's own body may not override ``__new__`` or ``_replace``, so a record that checks
or canonicalizes its fields is a NamedTuple of its fields with a subclass that mixes
:class:`Checked` in first and overrides :meth:`Checked._checked`::

    class _SpanFields(NamedTuple):
        start: int
        stop: int = 0


    class Span(Checked, _SpanFields):
        __slots__ = ()

        def _checked(self) -> Span:
            if self.stop < self.start:
                raise ValueError(f"stop={self.stop} is before start={self.start}")
            return self

Every way of building one goes through :meth:`Checked._checked`: the constructor,
``_replace``, ``_make``, and copying and unpickling (which call the constructor with the
fields, ``__getnewargs__``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["Checked"]

_R = TypeVar("_R", bound="Checked")


class Checked:
    """Mixed into a NamedTuple subclass (before the NamedTuple): its fields are checked,
    and may be canonicalized, by :meth:`_checked` whenever a record is built."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # the NamedTuple's own __new__ binds the arguments (names, defaults, count)
        return super().__new__(cls, *args, **kwargs)._checked()  # type: ignore[call-arg]

    def _checked(self: _R) -> _R:
        """The record to keep: ``self``, or a copy holding canonical field values
        (``tuple.__new__(type(self), values)``). Raises for a bad field."""
        return self

    @classmethod
    def _make(cls: type[_R], iterable: Iterable[Any]) -> _R:
        return cls(*iterable)

    def _replace(self: _R, **changes: Any) -> _R:
        """A copy with ``changes`` applied, checked as a new record is."""
        unknown = sorted(set(changes) - set(self._fields))  # type: ignore[attr-defined]
        if unknown:  # (else the fields tuple's __new__ would name itself, a private class)
            raise TypeError(f"{type(self).__name__}._replace: unknown field(s) {unknown}; "
                            f"fields: {list(self._fields)}")  # type: ignore[attr-defined]  # fmt: skip
        return type(self)(**{**self._asdict(), **changes})  # type: ignore[attr-defined]
