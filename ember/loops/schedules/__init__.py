"""Default schedules of the kernel classes that have fast schedules of their own (DESIGN.md
decision 6): each takes the plain loop nest that lowering yields and a schedule, data that
names its parameters, and returns the scheduled nest. `gemm`: matmul."""
