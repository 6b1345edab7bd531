"""The suite's one error for bad input: every command prints it as ``error: <one line>`` and
exits 2, before anything is written."""


class SweepError(Exception):
    """Bad sweep input; the message is one line naming the key or file and what is expected."""
