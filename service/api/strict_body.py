"""Strict request bodies: JSON parsed without guesswork, then validated in pydantic strict mode.

FastAPI's own ``json.loads`` keeps the last of two duplicated keys, reads ``NaN`` and
``Infinity``, and lets pydantic coerce ``"6"`` to 6 and ``true`` to 1. Every route of
:data:`StrictRoute` reads its JSON body here instead (:func:`parse_strict_json`, then
:func:`strict_model`); every refusal is a 422 problem document whose ``errors`` name the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import HTTPException, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from service.api.schemas import PROBLEM_BASE, FieldProblem, Problem

MAX_DEPTH = 32
MAX_LIST_ITEMS = 1000
MAX_STRING_CHARS = 10_000
MAX_INT_DIGITS = 30
BODY = "(body)"

M = TypeVar("M", bound=BaseModel)


class ProblemHTTPError(HTTPException):
    """A problem document raised while FastAPI reads the body (where only HTTPExceptions pass)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(status_code=problem.status, detail=problem.detail)
        self.problem = problem


def field_problems(errors: list[dict[str, Any]], drop_prefix: tuple[str, ...] = ("body",)) -> list[FieldProblem]:
    """Pydantic errors as dotted field paths (``alpha.low``), without the ``body`` prefix.

    Cross-field checks raise pydantic errors with their own ``loc``
    (:func:`objectives.field_errors.located_errors`), so every path comes from ``loc``.
    """
    problems = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        if loc and loc[0] in drop_prefix:
            loc = loc[1:]
        problems.append(FieldProblem(field=".".join(loc) or BODY, message=str(error.get("msg", ""))))
    return problems


def invalid_body(errors: list[FieldProblem], title: str = "Invalid sweep spec") -> ProblemHTTPError:
    listing = "; ".join(f"{p.field}: {p.message}" for p in errors[:5])
    return ProblemHTTPError(Problem(
        type=PROBLEM_BASE + "invalid-spec", title=title, status=422,
        detail=f"{len(errors)} problem(s): {listing}", errors=errors))


class _Refused:
    """A JSON token refused by the parser, kept in place so that its path can be named."""

    def __init__(self, why: str) -> None:
        self.why = why


class _Object(dict):
    """A JSON object that remembers which of its keys were repeated."""

    repeated: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    obj.repeated = []
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen and key not in obj.repeated:
                obj.repeated.append(key)
            seen.add(key)
    return obj


def _constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a number JSON allows; give a finite number")


def _float(text: str) -> float | _Refused:
    value = float(text)
    if not math.isfinite(value):
        return _Refused(f"{text} is out of range for a 64-bit float")
    return value


def _int(text: str) -> int | _Refused:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return _Refused(f"an integer of {len(text.lstrip('-'))} digits is out of range")
    return int(text)


def _text_problem(value: str, what: str) -> str | None:
    if len(value) > MAX_STRING_CHARS:
        return f"{what} of {len(value)} characters is longer than {MAX_STRING_CHARS}"
    if "\x00" in value:
        return f"{what} holds a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid Unicode (a lone surrogate escape)"
    return None


def _walk(node: Any, path: list[str], problems: list[FieldProblem]) -> None:
    field = ".".join(path) or BODY
    if len(problems) >= 20:
        return
    if len(path) > MAX_DEPTH:
        problems.append(FieldProblem(field=field, message=f"nested deeper than {MAX_DEPTH} levels"))
        return
    if isinstance(node, _Refused):
        problems.append(FieldProblem(field=field, message=node.why))
    elif isinstance(node, str):
        why = _text_problem(node, "a string")
        if why:
            problems.append(FieldProblem(field=field, message=why))
    elif isinstance(node, list):
        if len(node) > MAX_LIST_ITEMS:
            problems.append(FieldProblem(
                field=field, message=f"a list of {len(node)} items is longer than {MAX_LIST_ITEMS}"))
            return
        for index, item in enumerate(node):
            _walk(item, [*path, str(index)], problems)
    elif isinstance(node, dict):
        for key in getattr(node, "repeated", ()):
            problems.append(FieldProblem(field=".".join([*path, key]),
                                         message="duplicated key: give each key once"))
        if len(node) > MAX_LIST_ITEMS:
            problems.append(FieldProblem(field=field, message=f"more than {MAX_LIST_ITEMS} keys"))
            return
        for key, value in node.items():
            why = _text_problem(key, "a key")
            if why:
                problems.append(FieldProblem(field=".".join([*path, key[:40]]), message=why))
                continue
            _walk(value, [*path, key], problems)


def parse_strict_json(raw: bytes) -> Any:
    """The JSON value of ``raw``; :class:`ProblemHTTPError` (422) for duplicated keys,
    ``NaN``/``Infinity`` (and numbers that overflow to them), integers with more than
    :data:`MAX_INT_DIGITS` digits, strings that are not valid Unicode (lone surrogates) or hold
    NUL, nesting deeper than :data:`MAX_DEPTH`, lists longer than :data:`MAX_LIST_ITEMS` and
    strings longer than :data:`MAX_STRING_CHARS`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise invalid_body([FieldProblem(field=BODY, message=f"the body is not UTF-8: {error}")],
                           "Invalid request body") from None
    try:
        data = json.loads(text, object_pairs_hook=_object, parse_constant=_constant,
                          parse_float=_float, parse_int=_int)
    except json.JSONDecodeError as error:
        raise invalid_body([FieldProblem(
            field=BODY, message=f"not valid JSON: {error.msg} at line {error.lineno} column "
                                f"{error.colno}")], "Invalid request body") from None
    except RecursionError:
        raise invalid_body([FieldProblem(
            field=BODY, message=f"nested deeper than {MAX_DEPTH} levels")]) from None
    problems: list[FieldProblem] = []
    _walk(data, [], problems)
    if problems:
        raise invalid_body(problems)
    return data


def strict_model(model: type[M], data: Any) -> M:
    """``data`` (from :func:`parse_strict_json`) validated in strict mode, or a 422 naming fields:
    integers refuse floats, strings are never read as numbers or booleans, booleans are not
    integers."""
    if not isinstance(data, dict):
        raise invalid_body([FieldProblem(
            field=BODY, message=f"the body must be a JSON object, got {type(data).__name__}")])
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as error:
        raise invalid_body(field_problems(list(error.errors()), ())) from None


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_strict_json(await self.body())
        return self._json


class StrictRoute(APIRoute):
    """An APIRoute whose JSON bodies are read by :func:`parse_strict_json`."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def strict_handler(request: Request):
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler


def strict_body(model: type[M]) -> Callable:
    """A dependency giving the request body as ``model``, validated in strict mode."""

    async def dependency(request: Request) -> M:
        return strict_model(model, await request.json())

    return dependency
