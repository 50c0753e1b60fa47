"""Fresh names for a nest that a schedule step builds into a kernel: loop variables
numbered on from the kernel's own, as its lowering numbers them (`i2` -> `task3`), and
locals `t<n>` after its others."""

from __future__ import annotations

import re

from ember.dtypes import DType
from ember.loops.ir import Buffer, For, Kernel, Var


class FreshNames:
    """The names a step's builder takes (`var(hint)`, `local(dtype, shape)`), none of them
    already in `kernel`; the locals made are in `locals`."""

    def __init__(self, kernel: Kernel):
        self.taken = {b.name for b in (*kernel.params, *kernel.locals)}
        loops = [s.var.name for s in kernel.walk() if isinstance(s, For)]
        self.taken |= set(loops)
        numbers = [int(m.group()) for name in loops if (m := re.search(r"\d+$", name))]
        self.next = max(numbers, default=-1) + 1
        self.first_local = len(kernel.locals)
        self.locals: list[Buffer] = []

    def var(self, hint: str) -> Var:
        while f"{hint}{self.next}" in self.taken:
            self.next += 1
        self.next += 1
        return Var(f"{hint}{self.next - 1}")

    def local(self, dtype: DType, shape=()) -> Buffer:
        n = self.first_local + len(self.locals)
        while f"t{n}" in self.taken:
            n += 1
        buffer = Buffer(f"t{n}", dtype, tuple(shape))
        self.taken.add(buffer.name)
        self.locals.append(buffer)
        return buffer
