"""Default schedules of the kernel classes that have fast schedules of their own (DESIGN.md
decision 6), one module a class. `gemm` is a step of the scheduling stage: it finds
matmuls in the plain nests that lowering yields and blocks them (the `gemm` primitive).
The others build the scheduled nest from the algorithm's pieces that a lowering gives
them (`conv`: implicit-GEMM convs; `depthwise`, `packed_conv`, `winograd`, `pool`,
`attention`) and read `ctx.target`. Each declares its tunable parameters as data
(`params`); `lanes` holds the vector loops they are built of."""
