"""The compiler: spec and rule front end, BDD, table slicing, targets.

Data flow: ``spec.py`` + ``rules.py`` (-> ``ast.py``) -> ``bdd.py`` -> ``slicing.py`` ->
``tables.py`` -> ``targets/``; ``driver.py`` runs the whole chain.
"""
