"""A depth-bounded suffix trie with occurrence counts: SuffixDecoding's structure (Oliaro et al.,
NeurIPS 2025, arXiv:2411.04975; ``arctic_inference.suffix_decoding``), in plain Python ints.

Every substring of at most ``max_depth`` tokens of the sequences added is a node; its ``count`` is
how many times it occurs. A child's count over its node's count estimates the probability that the
child's token follows the node's substring. Appending one token extends the ``max_depth`` suffixes
that end at the sequence's end by one node each: O(max_depth) dictionary operations per token, so
building over ``n`` tokens takes O(n * max_depth) time and at most n * max_depth nodes (linear in
the tokens added for a fixed depth; a path-compressed suffix tree, as the authors' C++ one, saves
memory, not the order of time).
"""
import heapq
from typing import List, Optional, Sequence, Tuple

ROOT = 0
TIE = 1e-9  # scores closer than this are equal: a float sum of path probabilities may round an exact tie either way
_SHIFT = 32  # an edge's key: parent << 32 | token (token ids below 2**32)


class SuffixTrie:
    """Substrings of up to ``max_depth`` tokens of one or more sequences, with their counts.

    ``active[j]`` is the node of the current sequence's last ``j`` tokens (``active[0]`` the root);
    ``start()`` begins a new sequence, so that no substring spans two of them."""

    def __init__(self, max_depth: int = 24):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.edges: dict = {}  # parent << 32 | token -> child
        self.count: List[int] = [0]  # occurrences of each node's substring
        self.token: List[int] = [-1]  # the last token of each node's substring
        self.best: List[int] = [-1]  # each node's first child in ``order``, -1 if none
        # each node's children, most frequent first, ties as the authors' tree orders them (the root's: as added)
        self.order: List[List[int]] = [[]]
        self.active: List[int] = [ROOT]
        self.tokens_added = 0

    def __len__(self) -> int:
        """Nodes, the root included."""
        return len(self.count)

    def start(self) -> None:
        """Begin a new sequence."""
        del self.active[1:]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the current sequence: O(max_depth) per token."""
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Append one token to the current sequence: O(max_depth)."""
        if not 0 <= token < 1 << _SHIFT:
            raise ValueError(f"token ids must be in [0, 2**32), got {token}")
        active = self.active
        self.count[ROOT] += 1
        self.tokens_added += 1
        top = len(active)  # suffixes of lengths 0..top-1; the longest stops growing at max_depth
        if top <= self.max_depth:
            active.append(ROOT)
        for j in range(min(top, self.max_depth) - 1, -1, -1):  # longest first: active[j] is read before it is replaced
            active[j + 1] = self._counted_child(active[j], token)

    def follow(self, matches: List[int], token: int) -> None:
        """Update ``matches``, the nodes of a context's last 0..m tokens that occur here (a context
        not added to this trie, e.g. the current request against the global memory), for one more
        token: O(max_depth). A suffix of a substring is a substring, so the matches are a prefix."""
        top = len(matches)
        if top <= self.max_depth:
            matches.append(-1)
        for j in range(min(top, self.max_depth) - 1, -1, -1):
            matches[j + 1] = self.edges.get(matches[j] << _SHIFT | token, -1)
        length = 1
        while length < len(matches) and matches[length] >= 0:
            length += 1
        del matches[length:]

    def _counted_child(self, parent: int, token: int) -> int:
        """Count one more occurrence of ``parent``'s substring followed by ``token``; keeps ``order``
        as the authors' sibling list (``_increment_count`` in arctic-inference's suffix_tree.cc): a
        new child joins at the end (so the oldest of the once-seen comes first); a counted child
        that is not the head of its group of equal counts moves before that head (the last of its
        new count); a head right after the group of its new count becomes that group's head."""
        key = parent << _SHIFT | token
        child = self.edges.get(key)
        siblings = self.order[parent]
        count = self.count
        if child is None:
            child = self.edges[key] = len(count)
            count.append(1)
            self.token.append(token)
            self.best.append(-1)
            self.order.append([])
            siblings.append(child)
        elif parent == ROOT:  # no draft starts at the root (a match has a token at least): its order is not kept
            count[child] += 1
            return child
        else:
            c = count[child]
            i = siblings.index(child)
            head = i
            while head > 0 and count[siblings[head - 1]] == c:
                head -= 1
            if head == i and i > 0 and count[siblings[i - 1]] == c + 1:
                head = i - 1
                while head > 0 and count[siblings[head - 1]] == c + 1:
                    head -= 1
            if head < i:
                del siblings[i]
                siblings.insert(head, child)
            count[child] = c + 1
        self.best[parent] = siblings[0]
        return child

    def child(self, parent: int, token: int) -> int:
        """The child of ``parent`` for ``token``, -1 if none."""
        return self.edges.get(parent << _SHIFT | token, -1)

    def find(self, tokens: Sequence[int]) -> int:
        """The node of the substring ``tokens``, -1 if it does not occur (or is longer than max_depth)."""
        node = ROOT
        for token in tokens:
            node = self.edges.get(node << _SHIFT | token, -1)
            if node < 0:
                return -1
        return node

    def children(self, node: int) -> List[int]:
        """The children of ``node``, most frequent first, ties in the authors' order (``_counted_child``)."""
        return list(self.order[node])

    def bound(self, node: int, budget: int) -> float:
        """An upper bound on the score of any draft of ``budget`` tokens from ``node``: path
        probabilities never grow, so none exceeds that of the most frequent child."""
        child = self.best[node]
        return budget * self.count[child] / self.count[node] if child >= 0 else 0.0

    def path(self, node: int, budget: int, min_prob: float) -> Tuple[List[int], float]:
        """The most frequent continuation of ``node``'s substring: at most ``budget`` tokens, each
        while the estimated probability of the path so far (the product of child count / node
        count) stays >= ``min_prob``. Returns (tokens, score = the sum of the path probabilities)."""
        tokens: List[int] = []
        prob, score = 1.0, 0.0
        count, best = self.count, self.best
        while len(tokens) < budget:
            child = best[node]
            if child < 0:
                break
            prob *= count[child] / count[node]
            if prob < min_prob:
                break
            tokens.append(self.token[child])
            score += prob
            node = child
        return tokens, score

    def tree(self, node: int, budget: int, min_prob: float) -> Tuple[List[int], List[int], float]:
        """SuffixDecoding's tree mode: up to ``budget`` continuations of ``node``'s substring,
        expanded greedily by estimated path probability (best first, ties in insertion order), none
        below ``min_prob``. Returns (tokens, parents, score): ``parents[i]`` is -1 for a child of
        ``node``, else the index of an earlier token (topological order); score sums the
        probabilities of the tokens taken."""
        tokens: List[int] = []
        parents: List[int] = []
        score, order = 0.0, 0
        heap: List[tuple] = []
        frontier = [(node, -1, 1.0)]
        while True:
            for parent_node, parent_index, prob in frontier:  # push the children of what was just taken
                total = self.count[parent_node]
                for child in self.children(parent_node):
                    p = prob * self.count[child] / total
                    if p < min_prob:
                        break  # children come most frequent first
                    heapq.heappush(heap, (-p, order, child, parent_index))
                    order += 1
            if len(tokens) >= budget or not heap:
                return tokens, parents, score
            neg, _, child, parent_index = heapq.heappop(heap)
            tokens.append(self.token[child])
            parents.append(parent_index)
            score -= neg
            frontier = [(child, len(tokens) - 1, -neg)]


def budget_for(match_len: int, max_spec_tokens: int, factor: float, offset: float) -> int:
    """SuffixDecoding's draft budget: min(max_spec_tokens, match_len * factor + offset), floored, >= 0."""
    return max(0, min(max_spec_tokens, int(match_len * factor + offset + 1e-6)))


def continued(trie: SuffixTrie, matches: Sequence[int]) -> int:
    """The longest match length ``j`` whose node ``matches[j]`` has a child (0: none): those lengths are ``1..j``, as a
    substring followed by a token has every suffix followed by it; found by bisection, not by asking every length
    (the sequence's own deepest suffixes are new, childless nodes: about twenty of the depth's 24 in open text)."""
    low, high = 0, len(matches) - 1  # matches[low] has a child or low == 0; matches[high + 1:] have none
    while low < high:
        middle = (low + high + 1) // 2
        if trie.best[matches[middle]] >= 0:
            low = middle
        else:
            high = middle - 1
    return low


def best_match_path(trie: SuffixTrie, matches: Sequence[int], max_spec_tokens: int, factor: float, offset: float,
                    min_prob: float, longest: Optional[int] = None) -> Tuple[List[int], float, int]:
    """The best draft over the match lengths: ``matches[j]`` is the node of the context's last ``j``
    tokens (``matches[0]`` the root, unused). Each length drafts within its own budget; the highest
    score wins, ties (within ``TIE``) to the longer match (as the authors' ``speculate``, whose float32 sums
    may break an exact tie either way). ``longest``: the longest length asked (None: ``continued``'s; a longer one
    asks childless nodes, which draft nothing). Returns (tokens, score, match length)."""
    best: Tuple[List[int], float, int] = ([], 0.0, 0)
    for j in range(continued(trie, matches) if longest is None else longest, 0, -1):  # longest first: a shorter match must score strictly more
        budget = budget_for(j, max_spec_tokens, factor, offset)
        if budget <= best[1] + TIE:  # a score never exceeds its budget, and budgets shrink with the match
            break
        if trie.bound(matches[j], min(budget, trie.max_depth - j)) <= best[1] + TIE:  # a node at depth j has descendants to max_depth
            continue
        tokens, score = trie.path(matches[j], budget, min_prob)
        if tokens and score > best[1] + TIE:
            best = (tokens, score, j)
    return best


def best_match_tree(trie: SuffixTrie, matches: Sequence[int], max_spec_tokens: int, factor: float, offset: float,
                    min_prob: float, longest: Optional[int] = None) -> Tuple[List[int], List[int], float, int]:
    """``best_match_path`` in tree mode: (tokens, parents, score, match length)."""
    best: Tuple[List[int], List[int], float, int] = ([], [], 0.0, 0)
    for j in range(continued(trie, matches) if longest is None else longest, 0, -1):  # a childless node drafts nothing
        budget = budget_for(j, max_spec_tokens, factor, offset)
        if budget <= best[2] + TIE:
            break
        # a tree may be wider than deep: each of its max_depth - j levels holds disjoint
        # continuations, whose probabilities sum to 1 at most
        if min(trie.bound(matches[j], budget), trie.max_depth - j) <= best[2] + TIE:
            continue
        tokens, parents, score = trie.tree(matches[j], budget, min_prob)
        if tokens and score > best[2] + TIE:
            best = (tokens, parents, score, j)
    return best
