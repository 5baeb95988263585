"""The process beneath the runtime: joining the process group (:mod:`.process_group`,
:mod:`.interface`), collectives and running alone (:mod:`.collectives`), failure detection
(:mod:`.failure`, :mod:`.watchdog`), restarts under torchrun (:mod:`.relaunch`), the memory
policy ``sc.init()`` applies and the peak probe (:mod:`.memory`, :mod:`.cpu_cache`), and the
exchange's traffic and time accounting (:mod:`.traffic`)."""
