"""The one exception tree of inferasim.

Every error the library raises on purpose is an `InferasimError`. A `UserError` is bad input: its
message names the field and the fix (the CLI exits 2 with it, the operator parks the tuning Invalid).
`CannotPredict` is a deployment no model here can price (an unknown architecture, a layout that does
not fit): a reason, not a defect. Classes that callers also catch by a built-in type keep it as a
second base (a UserError is a ValueError).
"""


class InferasimError(Exception):
    """Base of every error inferasim raises on purpose."""


class UserError(InferasimError, ValueError):
    """Bad input: the message names the field and the fix."""


class CannotPredict(InferasimError):
    """Raised by a predictor (fit or predict) with a human-readable reason."""
