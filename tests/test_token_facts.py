"""The pure side of token_facts: how a `tokens` fact's ids are grouped, merged and joined. What the store does
with them (chunk rows, the writer's memory of them) is the store contract's, on every backend
(tests/store_contract.py, TokenFactsContract)."""

from __future__ import annotations

from service.store import token_facts


def test_groups_survive_merging_and_joining() -> None:
    one, two = {"ids": [1]}, {"ids": [2, 3], "groups": [2]}
    assert token_facts.group_sizes(one) == [1]
    assert token_facts.merge_token_facts([one, {"ids": [4]}]) == {"ids": [1, 4]}  # all ones: no `groups`
    assert token_facts.merge_token_facts([one, two]) == {"ids": [1, 2, 3], "groups": [1, 2]}
    joined = token_facts.join_last_group(two, {"ids": [4]})
    assert joined == {"ids": [2, 3, 4], "groups": [3]}
    assert token_facts.join_last_group(one, {"ids": [5], "logprobs": ["x"]}) == {
        "ids": [1, 5],
        "logprobs": [None, "x"],
        "groups": [2],
    }
