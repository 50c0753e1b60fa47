"""A schedule's tunable parameters, declared as data: name -> (default, the values a search
tries). `chosen` asks the lowering context for their values (the defaults, unless a tuned
compile gives others: ember/loops/tune/knobs.py)."""

from __future__ import annotations

Parameters = dict[str, tuple[int, tuple[int, ...]]]


def chosen(ctx, kernel_class: str, parameters: Parameters, **defaults: int) -> dict[str, int]:
    """The values of `kernel_class`'s `parameters` for the kernel `ctx` (a LowerContext) is
    lowering; `defaults` replace the declared ones where they depend on the shape."""
    return ctx.knobs(kernel_class,
                     {name: defaults.get(name, value) for name, (value, _) in parameters.items()},
                     **{name: values for name, (_, values) in parameters.items()})
