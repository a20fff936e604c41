"""Claims as data (issue 38): the papers' claims declared once (:mod:`.registry`, part
modules :mod:`.seed000`, :mod:`.seed002`, :mod:`.seed003`), labelled by one set of rules
(:mod:`.rules`), applied to every model column (:mod:`.models`) and rendered into tables and
prose (:mod:`.render`)."""
