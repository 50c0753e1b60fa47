"""Default schedules of the kernel classes that have fast schedules of their own (DESIGN.md
decision 6), one module a class. Most are steps of the scheduling stage: each finds its
class's plain nests in a kernel (`gemm.match_gemm`; `window_nest` for convs and pools;
`attention.match_attention`) and rebuilds one by a composite primitive (`gemm`,
`conv_gemm`, `packed_conv`, `depthwise_conv`, `pool`, `attention`) from the target's facts
and its parameters. Each
declares its tunable parameters as data (`params`); `lanes` holds the vector loops they
are built of, `names` the fresh names a step takes."""
