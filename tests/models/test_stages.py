"""The attention stages the kernel tools check, read from the arch tables (mmppma.models.backbones.stages), against
the stages written out by hand from the papers' tables."""
import pytest

from mmppma.models.backbones.stages import SHIPPED, attention_stages, model_shapes

HAND = {
    'ppma_t': (('cc', 'cc', 'whole', 'whole'), (4, 4, 8, 16), (16, 32, 32, 32)),
    'ppma_b': (('cc', 'cc', 'cc', 'whole'), (5, 5, 10, 16), (16, 32, 32, 32)),
    'rmt_s': (('rmt_cc', 'rmt_cc', 'rmt_cc', 'manhattan'), (4, 4, 8, 16), (16, 32, 32, 32)),
    'mlla_b': (('linear', ) * 4, (3, 6, 12, 24), (32, 32, 32, 32)),
}


@pytest.mark.parametrize('label', sorted(HAND))
def test_stages_come_from_the_arch_tables(label):
    assert attention_stages(label) == HAND[label]


def test_shapes_at_an_input_size():
    assert set(SHIPPED) >= set(HAND)
    rows = model_shapes(['upernet_512'], ['ppma_t'])
    assert [(kind, shape) for _, kind, shape in rows] == [
        ('cc', (2, 4, 128, 128, 16)), ('cc', (2, 4, 64, 64, 32)), ('whole', (2, 8, 32, 32, 32)),
        ('whole', (2, 16, 16, 16, 32))]
