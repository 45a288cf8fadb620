from vramlab.lessons.predict import given, guess


def test_an_empty_prediction_says_so_and_a_given_one_is_formatted():
    assert guess(None) == "no prediction given"
    assert guess(None, none="") == ""
    assert guess(16, "{}x") == "predicted 16x"
    assert guess(2.0, lambda v: f"{v:.2f} bytes") == "predicted 2.00 bytes"
    assert given(0) and not given(None)


def test_a_guess_in_words_is_judged_in_either_language():
    from vramlab.i18n import set_lang
    from vramlab.lessons.predict import matches

    for word in ("error", "Error", " ERRO ", '"erro"'):
        assert matches(word, "error"), word
    assert matches("RAM do host", "host RAM") and matches("host ram", "host RAM")
    assert not matches("host RAM", "error") and not matches(0, "error") and not matches(None, "error")
    assert guess("erro", answer="error") == "predicted erro: right"
    assert guess("erro", answer="host RAM") == "predicted erro: it was host RAM"
    set_lang("pt-BR")
    try:
        assert guess("error", answer="error") == "seu palpite: error (acertou)"
        assert guess("error", answer="host RAM") == "seu palpite: error (a resposta era RAM do host)"
        assert guess(None) == "nenhum palpite dado"
    finally:
        set_lang(None)
