"""The tasks the server serves: the table (:mod:`.table`) and, one module per family, the
request parameters each task declares (:mod:`.text`, ...). Pure data: no torch."""
