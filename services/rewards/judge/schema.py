"""A small JSON-schema subset checker for verdicts (object/number/integer/string/boolean/array,
required, properties, enum, minimum/maximum, additionalProperties false).

Verdict schemas are ours and simple; this keeps the service free of a schema
library and gives one readable error message for the repair prompt.
"""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
}


def schema_errors(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema`` (empty: valid)."""
    kind = schema.get("type")
    if kind is not None:
        ok = isinstance(value, _TYPES[kind]) and not (
            kind in ("number", "integer") and isinstance(value, bool)
        )
        if not ok:
            return [f"{where}: expected {kind}, got {type(value).__name__}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: must be one of {schema['enum']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: above the maximum {schema['maximum']}")
    if isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where}: missing required field {name!r}")
        for name, item in value.items():
            if name in properties:
                errors.extend(schema_errors(item, properties[name], f"{where}.{name}"))
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: unexpected field {name!r}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, schema["items"], f"{where}[{i}]"))
    return errors
