"""Array-level building blocks that several algorithm packages share, compiled by numba where it is installed.

The lowest layer of the library, importing nothing of ``petals_chain``'s but itself: the numba stand-in
(:mod:`.jit`), the heaps every event loop keeps (:mod:`.heap`), the chain dispatch decisions (:mod:`.dispatch_rules`),
the chain simulator's event loops (:mod:`.chain_sim`) and the Poisson job stream (:mod:`.poisson`). The dispatch
policies, the simulator, the recomposition's mean estimate and the moldable simulators all build on them, so each
is written once and none of those packages reaches into another's private code.
"""
