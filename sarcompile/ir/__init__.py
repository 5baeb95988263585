"""The intermediate representation: what a traced model is rewritten into. :mod:`.opdef`
says what an op is and :mod:`.ops` exports the few sparse primitives every layer lowers to
(each defined once, in the module of its family: its checks, residency, exchange, saved
tensors and temporaries), :mod:`.vocab` names the choices passes make (modes, strategies,
executors), :mod:`.lowering` is the registry of layer rules the front-ends fill,
:mod:`.probe` runs a program on small graphs to learn its shapes, and :mod:`.rng` draws
dropout masks keyed by global ids, so that any number of workers draws the same ones."""
