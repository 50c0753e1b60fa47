"""Running what codegen made: the memory plan of a program's temps, the compiled
executable that checks inputs and calls the native entry, and the compile caches."""
