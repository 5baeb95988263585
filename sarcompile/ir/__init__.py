"""The intermediate representation: what a traced model is rewritten into. :mod:`.graph` holds
the one-machine graph, :mod:`.opdef` and :mod:`.ops` define the few sparse primitives every
layer lowers to (each op once: its checks, residency, exchange, saved tensors and
temporaries), :mod:`.vocab` names the choices passes make (modes, strategies, executors),
:mod:`.lowering` is the registry of layer rules the front-ends fill, :mod:`.probe` runs a
program on small graphs to learn its shapes, and :mod:`.rng` draws dropout masks keyed by
global ids, so that any number of workers draws the same ones."""
