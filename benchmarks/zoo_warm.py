"""Imported by the zoo workers' fork server only (``zoo_pool.start_server``): runs the zoo's
``warm()`` there once, if it has one, so the workers forked from it start warm.

PyG generates each ``MessagePassing`` class's ``propagate`` from a template the first time
the class is built in a process (a file rendered, written and imported): built once here,
every worker inherits it, where each worker of each world size generated every class again.
"""

import importlib
import os
import sys

_name = os.environ.get("ZOO_CASES_MODULE", "")
# The zoo run as a script is "__main__"; the server has imported it as "__mp_main__".
_zoo = sys.modules.get("__mp_main__") if _name == "__main__" else importlib.import_module(_name) if _name else None
if _zoo is not None and hasattr(_zoo, "warm"):
    _zoo.warm()
