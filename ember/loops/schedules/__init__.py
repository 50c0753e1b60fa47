"""Default schedules of the kernel classes that have fast schedules of their own (DESIGN.md
decision 6), one module a class: each builds the scheduled nest from the plain loop nest
that lowering yields (`gemm`: matmul) or from the algorithm's pieces the lowering gives it
(`conv`: implicit-GEMM convs; `depthwise`, `packed_conv`, `winograd`, `pool`, `attention`),
reads `ctx.target`, and declares its tunable parameters as data (`params`). `lanes` holds
the vector loops they are built of."""
