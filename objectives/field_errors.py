"""Validation errors that name their fields: pydantic's own error type with a ``loc`` each.

A model validator that finds several problems across fields (a contradiction between two
sections, one bad entry of a list) raises :func:`located_errors`; pydantic keeps every
error's ``loc``, prefixed with where the model sits in the document, so the API and the CLI
name the exact field path (``loss_stacks.1.alpha``) without parsing messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

# One problem: the path of the field inside the model being validated, and what is wrong.
LocatedProblem = tuple[tuple[str | int, ...], str]


def located_errors(title: str, problems: Sequence[LocatedProblem], input_value: object = None) -> ValidationError:
    """A ``ValidationError`` with one ``invalid_combination`` error per problem (raise it)."""
    return ValidationError.from_exception_data(title, [
        InitErrorDetails(type=PydanticCustomError("invalid_combination", "{reason}", {"reason": message}),
                         loc=loc, input=input_value)
        for loc, message in problems
    ])
