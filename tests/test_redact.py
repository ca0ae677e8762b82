"""tracker/redact.py: the one place that hides credentials, by key and by value."""

from __future__ import annotations

from tracker import redact
from tracker.redact import HIDDEN, MASK, mask_params, shown_uri


def test_a_shown_uri_leaves_the_credentials_out():
    assert shown_uri("postgresql://board:pw%40x@db.internal:5432/mlflow") == "postgresql://db.internal:5432/mlflow"
    assert shown_uri("https://alice@mlflow.example/") == "https://mlflow.example/"
    assert shown_uri("http://u:p@[::1]:5000") == "http://[::1]:5000"
    assert shown_uri("sqlite:////srv/draftboard/draftboard.db") == "sqlite:////srv/draftboard/draftboard.db"
    assert shown_uri("http://u:p@host:notaport/x") == "http://host:notaport/x"  # unparseable port: still hidden


def test_a_password_holding_a_slash_hash_or_question_mark_is_hidden_whole():
    """Issue 48 S2: SQLAlchemy and MLflow read `postgresql://admin:pa/ss@db/x` as the password `pa/ss`;
    urllib sees the host `admin` and a path, and the old pattern stopped at the '/': both showed a part."""
    for password in ("pa/ss", "pa#ss", "pa?ss", "p/a#s?s@x", "12/ss"):
        uri = f"postgresql://admin:{password}@db/x"
        for shown in (redact.text(f"store {uri} refused"), shown_uri(uri), redact.short_uri(uri)):
            assert "admin" not in shown and "ss" not in shown.replace("postgresql", ""), shown
        assert shown_uri(uri) == "postgresql://db/x" and redact.short_uri(uri) == "db (postgresql)"
    # a text that cannot be taken apart as a URL at all still loses what looks like userinfo
    assert redact.text("x://u:p[w@host]:99/") == "x://host]:99/"
    # linear: a long run of would-be schemes and '@'s is read in one pass (bounded repeats)
    assert len(redact.text("a://" * 20_000 + "@" * 20_000)) < 200_000


def test_a_password_holding_a_quote_a_space_or_a_bracket_or_of_any_length_is_hidden():
    """Issue 64, F12: SQLAlchemy takes `"` and a space in a password as written; the old pattern stopped at them
    (and at 512 characters), showing the password."""
    for password in ('pa"ss', "pa ss", "pa<ss", "x" * 600 + "ss", "pass\tword"):
        uri = f"postgresql://admin:{password}@db/x"
        shown = redact.text(f"error: cannot open {uri} (check it)")
        assert "admin" not in shown and "ss" not in shown.replace("postgresql", "") and "word" not in shown, shown
        assert shown == "error: cannot open postgresql://db/x (check it)"
    # a URL without userinfo keeps its text, and one line's URLs are each read on their own
    assert redact.text("http://h:5000/x and https://u:p@k/y") == "http://h:5000/x and https://k/y"
    # linear: a long line of would-be URLs, spaces and '@'s
    assert len(redact.text(("a:// b " * 50_000) + "@")) < 400_000


def test_a_short_uri_fits_a_sidebar_and_still_hides_credentials():
    assert redact.short_uri("sqlite:////srv/draftboard/draftboard.db") == "draftboard.db (sqlite)"
    assert redact.short_uri("postgresql+psycopg://board:pw@db.internal:5432/mlflow") == "db.internal:5432 (postgresql)"
    assert redact.short_uri("https://alice:s3cret@mlflow.example/") == "mlflow.example (https)"
    assert redact.short_uri("/srv/mlruns") == "mlruns (file)"
    assert redact.short_uri("http://u:p@host:notaport/x") == "http://host:notaport/x"


def test_secrets_inside_a_text_are_hidden_wherever_they_stand():
    said = ("cannot use tracking store http://admin:S3CRET@mlflow.internal:5000: 401; "
            "dsn postgresql://board:pw@db/x?sslmode=require&password=hunter2 token=abc123 api_key=k-9 "
            '["--tracking-uri", "https://u:p4ss@h/"] max_new_tokens=64 mask_token_id=5')
    shown = redact.text(said)
    assert redact.text("mysql://u:p@ss@w0rd@db:3306/x") == "mysql://db:3306/x"  # a raw '@' in the password
    # a quote in the password (issue 37, finding 10: the shower hid it, the text redactor did not)
    assert redact.text("store postgresql://u:pa'ss@db/x failed") == "store postgresql://db/x failed"
    for secret in ("S3CRET", "admin", "board:pw", "hunter2", "abc123", "k-9", "p4ss"):
        assert secret not in shown, secret
    assert "http://mlflow.internal:5000" in shown and "postgresql://db/x?sslmode=require" in shown
    assert f"password={HIDDEN}" in shown and f"token={HIDDEN}" in shown
    assert "max_new_tokens=64" in shown and "mask_token_id=5" in shown  # not secrets


def test_params_are_masked_by_key_and_by_value():
    masked = mask_params({"wandb_key": "abc", "database_url": "postgresql://admin:SECRET@db/x", "lr": "1e-4",
                          "hub_token": "", "note": "see https://u:pw@host/run"})
    assert masked == {"wandb_key": MASK, "database_url": "postgresql://db/x", "lr": "1e-4", "hub_token": "",
                      "note": "see https://host/run"}


def test_which_keys_look_secret():
    for key in ("mlflow_password", "MLFLOW_TRACKING_PASSWORD", "apiKey", "aws_secret_access_key", "swanlab_key",
                "db_credentials", "access_key_id", "HF_TOKEN", "db_pass"):
        assert redact.is_secret_key(key), key
    for key in ("mask_token_id", "tokenizer_path", "max_new_tokens", "num_draft_tokens", "keyword_filter",
                "passes", "compass"):
        assert not redact.is_secret_key(key), key
