"""libgomp's spin count, set before anything in this process loads libgomp.

libgomp runs Ember's compiled parallel loops (and PyTorch's). When it counts more threads
than cores, a worker spins only 1000 times before it sleeps, and then every kernel of a
model pays a futex wake-up; GOMP_SPINCOUNT=300000 (libgomp's usual default) keeps workers
spinning between kernels. In one run of `ember explain` on MobileNetV2, a whole inference
took 9.4 ms without it and 5.9 ms with it (the kernels alone, 5.0-5.5 ms either way); other
runs showed no difference. libgomp reads the variable once, when it is loaded, so it takes
effect when Ember is imported before torch; a value the user set is kept.
"""

import os

os.environ.setdefault("GOMP_SPINCOUNT", "300000")
