"""Runs the programs of one cluster side by side, for `dsl.cluster_sum` (the CLUSTER_SUM rule: rules_cluster.py).

A cluster_sum needs every program of the cluster to have reached it, so the interpreter cannot run a
cluster's programs one after another when the kernel calls it. `ClusterExchange.run` gives each
program a Python thread but lets exactly one run at a time: a program runs until it waits in a
cluster_sum (or ends), then the lowest-ranked program that can run takes over. Rank 0 starts; when the
last program of the cluster arrives in a cluster_sum, the sums are made (in rank order) and rank 0
goes on first again. So memory accesses and atomics stay sequential, every launch runs in the same
order, and rank 0 makes each of its multicast loads before the other ranks make theirs (cluster.py).

A program that ends (or fails) while another waits in a cluster_sum, or calls cluster_sum after another
ended, would leave the cluster waiting for ever on the GPU: here it raises InterpreterError. Every
thread has ended when `run` returns or raises.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np

from ..language.numerics import arithmetic
from .context import element_type

_READY, _WAITING, _DONE = "ready", "waiting", "done"


class _Aborted(BaseException):
    """Unwinds a program whose cluster stopped (another program failed). A BaseException, so that no
    `except Exception` of a rule catches it."""


class ClusterExchange:
    """The programs of one cluster (their contexts, by rank) and the cluster_sum calls they make.

    A cluster_sum call waits under `_condition` until every program made the same call; `_turn` is the
    rank that may run (None: none can), `_state` says per rank whether it can run, waits in a
    cluster_sum, or has ended.
    """

    def __init__(self, contexts: Sequence):
        self._contexts = list(contexts)
        size = len(self._contexts)
        self._condition = threading.Condition()
        self._state = [_READY] * size
        self._turn = 0
        self._arrivals: dict = {}           # rank -> (op, values) of the call being gathered
        self._results: list = [None] * size
        self._failure = None                # the first exception of a program (or of the launching thread)
        for context in self._contexts:
            context.cluster_exchange = self

    def run(self, program: Callable) -> None:
        """Run `program(context)` for every program of the cluster, one thread each, one at a time.

        Raises the first exception a program raised (InterpreterError for mismatched cluster_sum calls).
        """
        threads = [threading.Thread(target=self._run_program, args=(rank, program), daemon=True,
                                    name=f"fusedops-interpreter-program-{context.program_id}")
                   for rank, context in enumerate(self._contexts)]
        started = []
        try:
            for thread in threads:
                thread.start()
                started.append(thread)
            for thread in threads:
                thread.join()
        except BaseException as error:      # e.g. KeyboardInterrupt in the launching thread
            with self._condition:
                self._fail(error)
            for thread in started:
                thread.join()
            raise
        if self._failure is not None:
            raise self._failure

    def _run_program(self, rank: int, program: Callable) -> None:
        context = self._contexts[rank]
        failure = None
        try:
            with self._condition:
                self._wait_for_turn(rank)
            with np.errstate(all="ignore"):     # per thread; IEEE results (inf, NaN) are the semantics
                program(context)
        except _Aborted:
            pass
        except BaseException as error:
            failure = error
        with self._condition:
            self._state[rank] = _DONE
            if failure is None and self._failure is None:
                failure = self._peer_left_waiting(rank)
            if failure is not None:
                self._fail(failure)
            else:
                self._pass_turn()

    def cluster_sum(self, context, op, values: Sequence) -> list:
        """The sums of `values` over the cluster (op's operands in program `context`), in rank order.

        Raises:
            InterpreterError: a program of the cluster has ended (it made fewer cluster_sum calls), or
                the values' types differ from another program's at this call.
        """
        rank = self._contexts.index(context)
        with self._condition:
            if self._failure is not None:
                raise _Aborted()
            context.cluster_sum_calls += 1
            calls = context.cluster_sum_calls
            for peer, state in enumerate(self._state):
                if state == _DONE:
                    other = self._contexts[peer]
                    raise context.error(op, f"cluster_sum runs {calls} times in this program but "
                                            f"{other.cluster_sum_calls} times in program {other.program_id} of "
                                            f"its cluster, which has ended: {_SAME_CALLS}")
            if self._arrivals:      # the values of every program's call must be alike (one is enough to compare)
                peer, (peer_op, _) = next(iter(self._arrivals.items()))
                types, peer_types = [v.type for v in op.operands], [v.type for v in peer_op.operands]
                if types != peer_types:
                    raise context.error(op, f"cluster_sum call {calls} sums values of types "
                                            f"({', '.join(map(str, types))}) in this program but "
                                            f"({', '.join(map(str, peer_types))}) in program "
                                            f"{self._contexts[peer].program_id} of its cluster: {_SAME_CALLS}")
            self._arrivals[rank] = (op, values)
            self._state[rank] = _WAITING
            if len(self._arrivals) == len(self._contexts):
                self._sum()
            self._pass_turn()
            self._wait_for_turn(rank)
            results, self._results[rank] = self._results[rank], None
            return results

    def _sum(self) -> None:
        """Every program waits in the same call: add their values in rank order, let them all go on."""
        arrivals = [self._arrivals[rank] for rank in range(len(self._contexts))]
        types = [element_type(v.type) for v in arrivals[0][0].operands]
        sums = []
        for index, dtype in enumerate(types):
            total = arrivals[0][1][index]
            for _, values in arrivals[1:]:
                total = arithmetic.add(total, values[index], dtype)
            sums.append(np.asarray(total))
        for rank in range(len(self._contexts)):
            self._results[rank] = [np.array(total, copy=True) for total in sums]   # no program shares an array
            self._state[rank] = _READY
        self._arrivals = {}

    def _peer_left_waiting(self, rank: int):
        """The error for program `rank` ending while another waits in a cluster_sum (None if none does)."""
        for peer, state in enumerate(self._state):
            if state == _WAITING:
                waiting, ended = self._contexts[peer], self._contexts[rank]
                op = self._arrivals[peer][0]
                return waiting.error(op, f"cluster_sum runs {waiting.cluster_sum_calls} times in this program but "
                                         f"{ended.cluster_sum_calls} times in program {ended.program_id} of its "
                                         f"cluster, which has ended: {_SAME_CALLS}")
        return None

    def _wait_for_turn(self, rank: int) -> None:
        while self._turn != rank and self._failure is None:
            self._condition.wait()
        if self._failure is not None:
            raise _Aborted()

    def _pass_turn(self) -> None:
        self._turn = next((rank for rank, state in enumerate(self._state) if state == _READY), None)
        self._condition.notify_all()

    def _fail(self, error: BaseException) -> None:
        """Stop the cluster: keep the first failure, wake every waiting program so that it unwinds."""
        if self._failure is None:
            self._failure = error
        self._turn = None
        self._condition.notify_all()


_SAME_CALLS = ("every program of a cluster must make the same cluster_sum calls (on the GPU the cluster "
               "would hang)")
