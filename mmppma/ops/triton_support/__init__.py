"""What the Triton paths of every op share: :mod:`.launch` (the launch table per GPU capability, ``Launch``,
``recording``, ``library_op``), :mod:`.tiles` (jitted tile helpers) and :mod:`.preflight` (the compile check
and the torch fallback of ``impl='auto'``).

Importing :mod:`.launch` or :mod:`.tiles` imports triton; the ops import them only when ``impl`` resolves to
``'triton'``, so everything else works where triton is missing.
"""
