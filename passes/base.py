"""What every pass shares: the result it returns, the reasons it records, its errors.

A pass is a function ``run(graph, ctx) -> PassResult``: pattern + check + rewrite. When a
pattern matches but a check fails, the pass records why with ``ctx.decline(node, reason)``;
`qfuse inspect` prints those reasons. An exception inside a pass is re-raised as ``PassError``
naming the pass and the node it was working on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from qfuse.ir import Graph, Node, Op
from qfuse.ir.postops import ComposerOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decline:
    node: str
    op: str
    reason: str


@dataclass
class PassResult:
    name: str
    changed: int = 0
    declined: list[Decline] = field(default_factory=list)

    @property
    def modified(self) -> bool:
        return self.changed > 0


class PassError(RuntimeError):
    def __init__(self, pass_name: str, node: Node | None, cause: BaseException) -> None:
        where = f" at node {node}" if node is not None else ""
        super().__init__(f"pass '{pass_name}' failed{where}: {type(cause).__name__}: {cause}")
        self.pass_name = pass_name
        self.node = node


@dataclass
class PassContext:
    """Options every pass may read, and the running record of the current pass."""

    composer: ComposerOptions = field(default_factory=ComposerOptions)
    disabled_passes: frozenset[str] = frozenset()
    # s8 activations written as u8 with zero point + 128 (decompose_fake_quantize): set by
    # compile_model where oneDNN's int8 kernels have no VNNI / AMX (they read u8 sources only
    # exactly, so every s8 source would be shifted by a reorder before each reader)
    unsigned_activations: bool = False
    # exact int8 on oneDNN kernels that sum products in int16 pairs (no VNNI / AMX, exact_int8
    # on): an int8 deconvolution is then split in halves added by a kernel of their own
    # (compiler/lower/no_vnni.py), which a 1x1 convolution avoids (deconv_as_depth_to_space)
    split_int8_deconvolutions: bool = False
    # the same CPUs: channel orders chosen so that fewer int16 pairs of input channels need
    # the excess kernel of pair-safe weights (passes/pair_channels.py)
    pair_input_channels: bool = False
    # the channel block of oneDNN's int8 depthwise kernel on this CPU where it applies binary
    # post-ops wrong on a channel tail (AVX2 8, SSE4.1 4; compiler/lower/lower_compute
    # WRONG_DEPTHWISE_CHANNEL_TAIL_BINARY), else 0: distribute_concat then moves no
    # per-channel operand into such a convolution (it would run on ref:any)
    depthwise_binary_block: int = 0
    current: PassResult | None = None
    current_node: Node | None = None

    def decline(self, node: Node, reason: str) -> None:
        """Record that ``node`` matched a pattern but was not rewritten, and why."""
        assert self.current is not None, "decline() outside a pass"
        self.current.declined.append(Decline(node.name, node.op.value, reason))
        log.info("%s: %s declined: %s", self.current.name, node, reason)

    def visit(self, node: Node) -> Node:
        """Note the node being worked on, so an error can name it."""
        self.current_node = node
        return node


PassFn = Callable[[Graph, PassContext], int]


def run_pass(name: str, fn: PassFn, graph: Graph, ctx: PassContext) -> PassResult:
    """Run one pass; ``fn`` returns the number of rewrites it made."""
    result = PassResult(name)
    ctx.current, ctx.current_node = result, None
    try:
        result.changed = fn(graph, ctx)
    except PassError:
        raise
    except Exception as exc:
        raise PassError(name, ctx.current_node, exc) from exc
    finally:
        ctx.current = None
    log.info("pass %s: %d rewrite(s), %d declined", name, result.changed,
             len(result.declined))
    return result


def rewrite_each(
    graph: Graph,
    ctx: PassContext,
    op: Op,
    check: Callable[[Graph, Node], str | None],
    rewrite: Callable[[Graph, Node], None],
) -> int:
    """Pattern + check + rewrite over every ``op`` node: ``check`` returns why a node cannot be
    rewritten (recorded as a decline) or None; returns the number of rewrites. Nodes left
    unread afterwards are removed."""
    count = 0
    for node in [n for n in graph.topo_order() if n.op is op]:
        ctx.visit(node)
        reason = check(graph, node)
        if reason is not None:
            ctx.decline(node, reason)
            continue
        rewrite(graph, node)
        count += 1
    if count:
        graph.remove_unused()
    return count


def rewrite_where(graph: Graph, ctx: PassContext, op: Op,
                  applies: Callable[[Graph, Node], bool],
                  rewrite: Callable[[Graph, Node], None]) -> int:
    """``rewrite`` every ``op`` node ``applies`` accepts, the others left silently (a shape
    rewrite for speed, not a fusion whose refusal `inspect` should report); returns the
    number of rewrites. Nodes left unread afterwards (the old weights) are removed."""
    count = 0
    for node in graph.topo_order():
        if node.op is op and applies(graph, node):
            ctx.visit(node)
            rewrite(graph, node)
            count += 1
    if count:
        graph.remove_unused()
    return count
