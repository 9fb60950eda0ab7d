"""The release portal's accounts: a name, a role (researcher or steward) and a password hash.

Researchers were given the Prefect server's admin secret to reach the portal, and with it the
power to run releases, spend budget and read the steward's evidence (issue 56). An account here
opens the portal only, in one of two roles; the portal (``deployments/portal.py``) decides what
each role may read.

**Where accounts live: beside the ledger**, so that every host that serves a portal agrees.

* With a PostgreSQL ledger (``MEDRELEASE_LEDGER_URL=postgresql://...``) they are the table
  ``medrelease_portal.accounts`` in the ledger's database: owned by the ledger's owner role
  (``medrelease_owner``), readable (SELECT only) by its service role, which every portal
  connects as. Adding or removing an account therefore needs the owner: ``medrelease portal
  add-user ... --admin-url postgresql://ADMIN@HOST/DB`` with the role that ran ``ledger
  init-db`` (it creates the schema on first use and acts as the owner role). A stolen service
  password reads the hashes and nothing else: it cannot add a steward.
* Otherwise a SQLite file, ``<MEDRELEASE_HOME>/portal-accounts.sqlite``, mode 0600 (created so,
  re-asserted on every change).

**Passwords** are never stored, logged or printed: only ``scrypt`` (RFC 7914, OpenSSL's, via
``hashlib``) of the password with a 16-byte random salt, N = 2**15, r = 8, p = 3 (32 MiB and
about 0.4 s per check here; one of OWASP's listed scrypt settings), kept as
``scrypt$N$r$p$<salt>$<key>`` so that stronger parameters can come later without breaking old
hashes. Comparison is constant-time (``hmac.compare_digest``). An account made for single sign-on
only (``--no-password``) stores ``!``, which no password matches.

The engine's rule holds: no Prefect here, and no web framework.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from medrelease.errors import MedreleaseError
from medrelease.privacy.ledger_url import is_database_url, redacted
from medrelease.settings import data_home

ROLES = ("researcher", "steward")
# Lower-case, so that "Alice" and "alice" are one account; '@' and '.' let a single sign-on
# name (an e-mail address) be an account name; no ':' (HTTP basic separates user and password
# with it) and nothing a terminal or a page would read as markup.
NAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")
MIN_PASSWORD_CHARS = 12
MAX_PASSWORD_CHARS = 1024  # a KDF over megabytes of "password" is a way to burn CPU

# scrypt's cost: OWASP's password storage cheat sheet lists N=2^15, r=8, p=3 among its
# equivalent minimum settings; 128 * r * N bytes = 32 MiB of memory per check.
SCRYPT_N = 2 ** 15
SCRYPT_R = 8
SCRYPT_P = 3
SALT_BYTES = 16
KEY_BYTES = 32
# Bounds on what a stored hash may ask of a check (an edited row must not make the portal
# allocate gigabytes per request).
MAX_N = 2 ** 20
MAX_RP = 64
NO_PASSWORD = "!"  # single sign-on only: no password matches it

SQLITE_NAME = "portal-accounts.sqlite"
PG_SCHEMA = "medrelease_portal"
PG_OWNER = "medrelease_owner"  # the ledger's roles (ledger_pg.OWNER_ROLE, SERVICE_ROLE)
PG_SERVICE = "medrelease_service"

# The one table, on both back-ends; the database itself bounds what a row may hold (a name
# check as the CLI's where the database has regular expressions).
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS accounts (
    name          TEXT PRIMARY KEY CHECK ({name_check}),
    role          TEXT NOT NULL CHECK (role IN ('researcher', 'steward')),
    password_hash TEXT NOT NULL CHECK (password_hash = '!' OR password_hash LIKE 'scrypt$%'),
    created_at    TEXT NOT NULL
)"""
SQLITE_NAME_CHECK = "length(name) BETWEEN 1 AND 64 AND name = lower(name)"
PG_NAME_CHECK = "name ~ '^[a-z0-9][a-z0-9._@-]{0,63}$'"


class AccountError(MedreleaseError):
    """An account cannot be added, removed or read as asked (the message says why)."""


class AccountStoreUnavailable(AccountError):
    """The account store cannot be read now (database down, file unreadable)."""


@dataclass(frozen=True)
class Account:
    """One portal account. ``password_hash`` is the stored form, never a password; ``repr``
    leaves it out so that no log line or traceback carries it."""

    name: str
    role: str
    password_hash: str
    created_at: str

    def __repr__(self) -> str:
        return f"Account(name={self.name!r}, role={self.role!r}, created_at={self.created_at!r})"

    @property
    def has_password(self) -> bool:
        return self.password_hash != NO_PASSWORD


def check_name(name: str) -> str:
    """The account name, or ``AccountError`` saying what a name may hold."""
    if not isinstance(name, str) or not NAME.match(name):
        raise AccountError("an account name is 1 to 64 characters: lower-case letters, digits, "
                           "'.', '_', '-' and '@', starting with a letter or digit")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise AccountError(f"role must be one of {', '.join(ROLES)}")
    return role


def check_password(password: str) -> str:
    """A password long enough to be worth hashing, and short enough to hash (never shown)."""
    if len(password) < MIN_PASSWORD_CHARS:
        raise AccountError(f"the password is shorter than {MIN_PASSWORD_CHARS} characters")
    if len(password) > MAX_PASSWORD_CHARS:
        raise AccountError(f"the password is longer than {MAX_PASSWORD_CHARS} characters")
    if password != password.strip():
        raise AccountError("the password starts or ends with white space (a stray newline "
                           "or space would make it impossible to type)")
    return password


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p,
                          maxmem=256 * r * n + (1 << 20), dklen=length)


def hash_password(password: str) -> str:
    """The stored form of ``password``: ``scrypt$N$r$p$<salt b64>$<key b64>``."""
    salt = secrets.token_bytes(SALT_BYTES)
    key = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P, KEY_BYTES)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(key)}"


# Checked when a name has no account, so that a wrong name costs the same time as a wrong
# password (the answer's time does not tell which names exist).
_DUMMY_HASH: str | None = None


def dummy_hash() -> str:
    global _DUMMY_HASH
    if _DUMMY_HASH is None:
        _DUMMY_HASH = hash_password(secrets.token_urlsafe(24))
    return _DUMMY_HASH


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches the stored hash; constant-time comparison of the keys.
    A malformed or out-of-bounds stored hash matches nothing."""
    if len(password) > MAX_PASSWORD_CHARS:
        return False
    try:
        scheme, n_text, r_text, p_text, salt_text, key_text = stored.split("$")
        n, r, p = int(n_text), int(r_text), int(p_text)
        salt = base64.b64decode(salt_text, validate=True)
        key = base64.b64decode(key_text, validate=True)
    except ValueError:
        return False
    if (scheme != "scrypt" or not (2 <= n <= MAX_N) or n & (n - 1) or not (1 <= r <= MAX_RP)
            or not (1 <= p <= MAX_RP) or len(salt) < 8 or not (16 <= len(key) <= 64)):
        return False
    return hmac.compare_digest(_scrypt(password, salt, n, r, p, len(key)), key)


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


class AccountStore:
    """Accounts at one place. ``get`` and ``has_accounts`` are what a portal reads per request;
    ``add`` and ``remove`` are the CLI's."""

    location: str

    def get(self, name: str) -> Account | None:
        raise NotImplementedError

    def accounts(self) -> list[Account]:
        raise NotImplementedError

    def has_accounts(self) -> bool:
        raise NotImplementedError

    def add(self, name: str, role: str, password: str | None, replace: bool = False
            ) -> Account:
        """Add (or with ``replace``, replace) an account; ``password`` None: single sign-on
        only. The password is hashed here and goes no further."""
        check_name(name)
        check_role(role)
        stored = NO_PASSWORD if password is None else hash_password(check_password(password))
        account = Account(name, role, stored, _now())
        self._write(account, replace)
        return account

    def remove(self, name: str) -> bool:
        raise NotImplementedError

    def _write(self, account: Account, replace: bool) -> None:
        raise NotImplementedError


class SqliteAccounts(AccountStore):
    """Accounts in a SQLite file readable by its owner only (0600)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.location = str(self.path)

    # reads: never create the file (a portal with no file has no accounts)
    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection | None]:
        if not self.path.exists():
            yield None
            return
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                   timeout=5)
        except sqlite3.Error as exc:
            raise AccountStoreUnavailable(f"cannot read the portal accounts {self.path}: "
                                          f"{exc}") from None
        try:
            yield conn
        except sqlite3.Error as exc:
            raise AccountStoreUnavailable(f"cannot read the portal accounts {self.path}: "
                                          f"{exc}") from None
        finally:
            conn.close()

    def get(self, name: str) -> Account | None:
        with self._reading() as conn:
            if conn is None:
                return None
            row = conn.execute("SELECT name, role, password_hash, created_at FROM accounts "
                               "WHERE name = ?", (name,)).fetchone()
        return Account(*row) if row else None

    def accounts(self) -> list[Account]:
        with self._reading() as conn:
            if conn is None:
                return []
            rows = conn.execute("SELECT name, role, password_hash, created_at FROM accounts "
                                "ORDER BY name").fetchall()
        return [Account(*row) for row in rows]

    def has_accounts(self) -> bool:
        with self._reading() as conn:
            if conn is None:
                return False
            return conn.execute("SELECT EXISTS (SELECT 1 FROM accounts)").fetchone()[0] == 1

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """The file created 0600 before SQLite opens it (no moment with wider rights), its
        mode re-asserted (a copy or restore may have widened it), the schema made."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            os.chmod(self.path, 0o600)
            conn = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise AccountError(f"cannot write the portal accounts {self.path}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(SCHEMA_SQL.format(name_check=SQLITE_NAME_CHECK))
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # the message names the constraint, never the row (no hash reaches a terminal)
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise AccountError(f"the account change was refused: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0]}") from None
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def _write(self, account: Account, replace: bool) -> None:
        with self._writing() as conn:
            exists = conn.execute("SELECT 1 FROM accounts WHERE name = ?",
                                  (account.name,)).fetchone()
            if exists and not replace:
                raise AccountError(f"account {account.name} exists: remove-user it first, "
                                   "or add-user --replace to set a new password or role")
            conn.execute("INSERT OR REPLACE INTO accounts VALUES (?, ?, ?, ?)",
                         (account.name, account.role, account.password_hash,
                          account.created_at))

    def remove(self, name: str) -> bool:
        if not self.path.exists():
            return False
        with self._writing() as conn:
            return conn.execute("DELETE FROM accounts WHERE name = ?", (name,)).rowcount > 0


class PostgresAccounts(AccountStore):
    """Accounts in the PostgreSQL ledger's database, table ``medrelease_portal.accounts``.

    Reads go through ``url`` (the service role's ``MEDRELEASE_LEDGER_URL``), on one connection
    kept per store; ``add`` and ``remove`` through ``admin_url`` only, acting as the owner
    role, because the service role may only read the table."""

    def __init__(self, url: str, admin_url: str | None = None, owner: str = PG_OWNER,
                 service: str = PG_SERVICE) -> None:
        self.url = url
        self.admin_url = admin_url
        self.owner = owner
        self.service = service
        self.location = f"{redacted(url)} (table {PG_SCHEMA}.accounts)"
        self._raw: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def _psycopg() -> Any:
        try:
            import psycopg
        except ImportError:  # pragma: no cover - psycopg is a dependency
            raise AccountError("PostgreSQL accounts need psycopg 3") from None
        return psycopg

    def _rows(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        """One query as the service role; a lost connection is made again next time."""
        psycopg = self._psycopg()
        with self._lock:
            try:
                if self._raw is None or self._raw.closed or self._raw.broken:
                    self._raw = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
                return self._raw.execute(sql, parameters).fetchall()
            except psycopg.errors.UndefinedTable:
                return []  # no account was ever added: the schema comes with the first
            except psycopg.Error as exc:
                with contextlib.suppress(Exception):
                    self._raw.close()
                self._raw = None
                raise AccountStoreUnavailable(
                    f"cannot read the portal accounts in {redacted(self.url)}: "
                    f"{type(exc).__name__}") from None

    def get(self, name: str) -> Account | None:
        rows = self._rows(f"SELECT name, role, password_hash, created_at::text FROM "
                          f"{PG_SCHEMA}.accounts WHERE name = %s", (name,))
        return Account(*rows[0]) if rows else None

    def accounts(self) -> list[Account]:
        return [Account(*row) for row in self._rows(
            f"SELECT name, role, password_hash, created_at::text FROM {PG_SCHEMA}.accounts "
            "ORDER BY name")]

    def has_accounts(self) -> bool:
        return bool(self._rows(f"SELECT 1 FROM {PG_SCHEMA}.accounts LIMIT 1"))

    @contextlib.contextmanager
    def _as_owner(self) -> Iterator[Any]:
        """A transaction on ``admin_url`` acting as the owner role, with the schema and the
        service role's read grant in place (made on first use, re-stated each time)."""
        if not self.admin_url:
            raise AccountError(
                "the portal accounts live in the PostgreSQL ledger's database, where the "
                "service role may only read them: add or remove accounts with --admin-url "
                "postgresql://ADMIN@HOST/DB (the role that ran 'medrelease ledger init-db'; "
                "its password from PGPASSWORD or ~/.pgpass)")
        psycopg = self._psycopg()
        from psycopg import sql

        try:
            raw = psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise AccountError(f"cannot connect with --admin-url {redacted(self.admin_url)}: "
                               f"{type(exc).__name__}") from None
        owner, service = sql.Identifier(self.owner), sql.Identifier(self.service)
        schema = sql.Identifier(PG_SCHEMA)
        try:
            with raw, raw.transaction():
                raw.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(owner))
                # made by the administrator (the owner role may not create schemas in the
                # database), owned by the owner role, as 'ledger init-db' makes the ledger's
                raw.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                    schema, owner))
                raw.execute(sql.SQL("SET LOCAL ROLE {}").format(owner))
                raw.execute(sql.SQL("SET LOCAL search_path = {}").format(schema))
                raw.execute(SCHEMA_SQL.format(name_check=PG_NAME_CHECK))
                raw.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(schema))
                raw.execute(sql.SQL("REVOKE ALL ON accounts FROM PUBLIC, {}").format(service))
                raw.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, service))
                raw.execute(sql.SQL("GRANT SELECT ON accounts TO {}").format(service))
                yield raw
        except psycopg.Error as exc:
            raise AccountError(f"the database refused the account change: "
                               f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None

    def _write(self, account: Account, replace: bool) -> None:
        with self._as_owner() as raw:
            exists = raw.execute("SELECT 1 FROM accounts WHERE name = %s",
                                 (account.name,)).fetchone()
            if exists and not replace:
                raise AccountError(f"account {account.name} exists: remove-user it first, "
                                   "or add-user --replace to set a new password or role")
            raw.execute("INSERT INTO accounts VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO "
                        "UPDATE SET role = EXCLUDED.role, password_hash = "
                        "EXCLUDED.password_hash, created_at = EXCLUDED.created_at",
                        (account.name, account.role, account.password_hash,
                         account.created_at))

    def remove(self, name: str) -> bool:
        with self._as_owner() as raw:
            return raw.execute("DELETE FROM accounts WHERE name = %s", (name,)).rowcount > 0


def sqlite_accounts_path() -> Path:
    """``<MEDRELEASE_HOME>/portal-accounts.sqlite``."""
    return data_home() / SQLITE_NAME


def open_accounts(admin_url: str | None = None) -> AccountStore:
    """The accounts beside the ledger: the PostgreSQL ledger's database when
    ``MEDRELEASE_LEDGER_URL`` names one (read as its service role; ``admin_url`` to change
    them), else the SQLite file under ``MEDRELEASE_HOME``."""
    url = os.environ.get("MEDRELEASE_LEDGER_URL", "").strip()
    if url and is_database_url(url):
        return PostgresAccounts(url, admin_url)
    if admin_url:
        raise AccountError("--admin-url is for accounts in a PostgreSQL ledger's database "
                           "(MEDRELEASE_LEDGER_URL); here they live in "
                           f"{sqlite_accounts_path()}")
    return SqliteAccounts(sqlite_accounts_path())
