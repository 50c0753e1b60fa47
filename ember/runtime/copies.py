"""Copy coalescing: a step that computes a temp only for a copy to move it into another
buffer writes that buffer itself, and the copy goes.

Control flow lowers its results through copies (ember/loops/lower/program.py): a branch
copies what it yields into the `if`'s result, a loop body copies its yields into the
carried buffers. In a loop over large arrays those copies are most of the traffic (a
Mandelbrot step: three carried arrays copied twice an iteration). For `copy(src, dst)`,
the step that writes `src` (a call, or an `if` whose branches each end by writing it)
writes `dst` instead when

- `src` is a temp that nothing else touches (only its writer and this copy),
- nothing between the writer and the copy touches `dst` (so its old value is not needed
  after the writer), and
- the writer reads `dst` itself only as the input of an in-place pair (`inplace_pairs`:
  each element read before the one store that overwrites it).

Inside a branch, the same rule holds from the branch's writer of `src` to its end.
"""

from __future__ import annotations

from dataclasses import replace

from ember.loops.ir import Call, Kernel, Program, ProgramIf, ProgramLoop, ProgramStep, Store
from ember.runtime.memory_plan import inplace_pairs, step_buffers


def coalesce_copies(program: Program) -> int:
    """Rewrite `program` in place; returns how many copies went."""
    coalescer = _Coalescer(program)
    coalescer.steps(program.steps)
    if coalescer.removed:
        used = set()
        for step in program.steps:
            used |= step_buffers(program, step)
        program.buffers = [b for b in program.buffers
                           if b.kind != "temp" or b.buffer.name in used]
    return coalescer.removed


class _Coalescer:
    def __init__(self, program: Program):
        self.program = program
        self.kernels = {k.name: k for k in program.kernels}
        self.kinds = {b.buffer.name: b.kind for b in program.buffers}
        self.pairs: dict[str, dict[str, str]] = {}
        self.removed = 0

    def steps(self, steps: list[ProgramStep]) -> None:
        for step in steps:  # the inner blocks first: their copies feed the outer ones'
            if isinstance(step, ProgramIf):
                self.steps(step.then)
                self.steps(step.orelse)
            elif isinstance(step, ProgramLoop):
                self.steps(step.body)
        j = 0
        while j < len(steps):
            if self.coalesce(steps, j):
                del steps[j]
                self.removed += 1
                j = 0  # a chain: the writer may feed an earlier copy now
                continue
            j += 1

    # -- the rule ---------------------------------------------------------------------------
    def coalesce(self, steps: list[ProgramStep], j: int) -> bool:
        step = steps[j]
        if not self.is_copy(step):
            return False
        src, dst = step.args
        if self.kinds.get(src) != "temp" or self.kinds.get(dst) not in ("temp", "output") \
                or src == dst:
            return False
        w = next((i for i in range(j) if src in self.touched(steps[i])), None)
        if w is None or not self.can_write(steps[w], src, dst) or any(
                dst in self.touched(steps[i]) for i in range(w + 1, j)):
            return False
        if self.leaves_touching(self.program.steps, src) != \
                self.leaves_touching([steps[w]], src) + 1:
            return False  # something else reads src
        steps[w] = self.rename(steps[w], src, dst)
        return True

    def can_write(self, step: ProgramStep, src: str, dst: str) -> bool:
        """Whether `step`, which writes `src` first, can write `dst` in its place."""
        if isinstance(step, Call):
            kernel = self.kernels[step.kernel]
            written = {s.buffer for s in kernel.walk() if isinstance(s, Store)}
            params = [p.name for p in kernel.params]
            outs = [p for p, a in zip(params, step.args) if a == src]
            if len(outs) != 1 or outs[0] not in written:
                return False
            pairs = self.inplace(kernel)
            return all(p not in written and pairs.get(outs[0]) == p
                       for p, a in zip(params, step.args) if a == dst)
        if isinstance(step, ProgramIf):
            return step.cond not in (src, dst) and all(
                self.branch_can_write(branch, src, dst) for branch in (step.then, step.orelse))
        return False

    def branch_can_write(self, steps: list[ProgramStep], src: str, dst: str) -> bool:
        w = next((i for i, s in enumerate(steps) if src in self.touched(s)), None)
        return w is not None and self.can_write(steps[w], src, dst) and not any(
            dst in self.touched(s) for s in steps[w + 1:])

    # -- helpers ----------------------------------------------------------------------------
    def is_copy(self, step: ProgramStep) -> bool:
        return isinstance(step, Call) and len(step.args) == 2 and \
            self.kernels[step.kernel].origin == "copy"

    def inplace(self, kernel: Kernel) -> dict[str, str]:
        if kernel.name not in self.pairs:
            self.pairs[kernel.name] = inplace_pairs(kernel)
        return self.pairs[kernel.name]

    def touched(self, step: ProgramStep) -> set[str]:
        return step_buffers(self.program, step)

    def leaves_touching(self, steps: list[ProgramStep], name: str) -> int:
        count = 0
        for step in steps:
            if isinstance(step, Call):
                count += name in step.args
            elif isinstance(step, ProgramIf):
                count += (step.cond == name) + self.leaves_touching(step.then, name) + \
                    self.leaves_touching(step.orelse, name)
            elif isinstance(step, ProgramLoop):
                count += (name in (step.trip_count, step.cond, step.counter)) + \
                    self.leaves_touching(step.body, name)
        return count

    def rename(self, step: ProgramStep, src: str, dst: str) -> ProgramStep:
        if isinstance(step, Call):
            return replace(step, args=[dst if a == src else a for a in step.args])
        if isinstance(step, ProgramIf):
            return replace(step, then=[self.rename(s, src, dst) for s in step.then],
                           orelse=[self.rename(s, src, dst) for s in step.orelse])
        raise TypeError(step)
