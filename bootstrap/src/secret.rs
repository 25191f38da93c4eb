//! The optional job secret that authenticates the bootstrap exchange.
//!
//! Anyone who can reach rank 0's port can otherwise join the rendezvous as a rank and receive
//! every rank's endpoints, including the rkeys of memory peers may write. With a secret, every
//! frame on every bootstrap connection carries an HMAC-SHA256 over its header and payload,
//! bound to a random challenge rank 0 sends when it accepts the connection and to a frame
//! counter per direction (the frame format is in [`wire`](crate::wire)); a client without the
//! secret is refused. The secret authenticates; it does not encrypt: someone who can read the
//! traffic still sees the endpoints.
//!
//! Where a secret comes from, never the cluster file (which is copied around and checked in):
//!
//! - [`JobSecret::from_file`], or the file named by `RVERBS_JOB_SECRET_FILE`
//!   ([`SECRET_FILE_ENV`]). Preferred: a file readable by the job's user only, made with
//!   for instance `head -c 32 /dev/urandom > job.secret; chmod 600 job.secret`.
//! - `RVERBS_JOB_SECRET` ([`SECRET_ENV`]), the secret itself as text. Environment variables
//!   are visible to other processes of the same user and to some launchers' logs, so prefer
//!   the file.
//! - [`JobSecret::new`] in code.
//!
//! [`JobSecret::from_env`] reads the two variables; `connect()` does so when its options carry
//! no secret. [`exchange`](crate::exchange()) uses exactly
//! [`ExchangeOptions::secret`](crate::ExchangeOptions::secret).

use crate::error::ExchangeError;
use core::fmt;
use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use hmac::{Hmac, KeyInit};
use sha2::Sha256;
use zeroize::Zeroizing;

/// Environment variable naming a file that holds the job secret.
pub const SECRET_FILE_ENV: &str = "RVERBS_JOB_SECRET_FILE";
/// Environment variable holding the job secret itself.
pub const SECRET_ENV: &str = "RVERBS_JOB_SECRET";
/// Shortest secret accepted, in bytes: 128 bits, so it cannot be guessed by trying.
pub const MIN_SECRET_LEN: usize = 16;
/// Largest secret file read, in bytes; a secret is a key, not a document.
pub const MAX_SECRET_FILE: u64 = 4096;

/// A job secret, ready to key HMAC-SHA256. Every rank of a job must hold the same one.
///
/// Its `Debug` output never shows the secret, and no error message of this crate contains
/// it. The key is wiped from memory when the last copy is dropped.
#[derive(Clone)]
pub struct JobSecret {
    key: Hmac<Sha256>,
}

impl JobSecret {
    /// A secret from bytes (at least [`MIN_SECRET_LEN`]).
    ///
    /// # Errors
    /// [`ExchangeError::SecretInvalid`] if `bytes` is too short.
    pub fn new(bytes: &[u8]) -> Result<Self, ExchangeError> {
        Self::from_bytes(bytes, "JobSecret::new")
    }

    /// Reads a secret from a file: its bytes, less one trailing line break (`\n` or `\r\n`),
    /// so a secret written with `echo` matches the same text in `RVERBS_JOB_SECRET`.
    ///
    /// # Errors
    /// [`ExchangeError::SecretRead`] if the file cannot be read;
    /// [`ExchangeError::SecretInvalid`] if it holds more than [`MAX_SECRET_FILE`] bytes or
    /// fewer than [`MIN_SECRET_LEN`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ExchangeError> {
        let path = path.as_ref();
        let read_error = |source| ExchangeError::SecretRead {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(read_error)?;
        let mut bytes = Zeroizing::new(Vec::new());
        // One byte past the cap tells an oversized file from one exactly at it, whatever
        // the file's metadata claims (a pipe or a device has no length).
        file.take(MAX_SECRET_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        let from = format!("file {}", path.display());
        if bytes.len() as u64 > MAX_SECRET_FILE {
            return Err(ExchangeError::SecretInvalid {
                from,
                reason: format!(
                    "holds more than {MAX_SECRET_FILE} bytes; a job secret is a key of a few dozen bytes"
                ),
            });
        }
        let text = strip_line_break(&bytes);
        Self::from_bytes(text, &from)
    }

    /// The secret named by the environment: the file in `RVERBS_JOB_SECRET_FILE`, or the
    /// text of `RVERBS_JOB_SECRET`; `None` if neither is set.
    ///
    /// # Errors
    /// [`ExchangeError::SecretInvalid`] if both are set, if one is set but empty, or if
    /// `RVERBS_JOB_SECRET` is not UTF-8; otherwise as [`JobSecret::from_file`] and
    /// [`JobSecret::new`].
    pub fn from_env() -> Result<Option<Self>, ExchangeError> {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// [`JobSecret::from_env`] over any variable lookup (tests pass their own).
    fn from_lookup(
        lookup: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Option<Self>, ExchangeError> {
        let file = lookup(SECRET_FILE_ENV);
        let text = lookup(SECRET_ENV);
        let invalid = |from: &str, reason: &str| ExchangeError::SecretInvalid {
            from: from.to_owned(),
            reason: reason.to_owned(),
        };
        match (file, text) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(invalid(
                SECRET_FILE_ENV,
                "is set together with RVERBS_JOB_SECRET; set only one",
            )),
            (Some(path), None) => {
                if path.is_empty() {
                    return Err(invalid(
                        SECRET_FILE_ENV,
                        "is set but empty; name the secret file, or unset it to run without a secret",
                    ));
                }
                Self::from_file(path).map(Some)
            }
            (None, Some(text)) => {
                if text.is_empty() {
                    return Err(invalid(
                        SECRET_ENV,
                        "is set but empty; set the secret, or unset it to run without one",
                    ));
                }
                let text = Zeroizing::new(text.into_string().map_err(|_| {
                    invalid(
                        SECRET_ENV,
                        "is not valid UTF-8; put a binary secret in a file and name it in RVERBS_JOB_SECRET_FILE",
                    )
                })?);
                Self::from_bytes(text.as_bytes(), SECRET_ENV).map(Some)
            }
        }
    }

    fn from_bytes(bytes: &[u8], from: &str) -> Result<Self, ExchangeError> {
        if bytes.len() < MIN_SECRET_LEN {
            return Err(ExchangeError::SecretInvalid {
                from: from.to_owned(),
                reason: format!(
                    "is {} bytes; a job secret needs at least {MIN_SECRET_LEN} (for example `head -c 32 /dev/urandom > job.secret`)",
                    bytes.len()
                ),
            });
        }
        // HMAC takes a key of any length (longer ones are hashed first).
        let key =
            Hmac::<Sha256>::new_from_slice(bytes).map_err(|_| ExchangeError::SecretInvalid {
                from: from.to_owned(),
                reason: "cannot key HMAC-SHA256".to_owned(),
            })?;
        Ok(Self { key })
    }

    /// A fresh HMAC keyed with the secret.
    pub(crate) fn hmac(&self) -> Hmac<Sha256> {
        self.key.clone()
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(<redacted>)")
    }
}

fn strip_line_break(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes.strip_suffix(b"\r").unwrap_or(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "correct horse battery staple";

    fn vars<'a>(pairs: &'a [(&'static str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| OsString::from(value))
        }
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let secret = JobSecret::new(TEXT.as_bytes()).unwrap();
        let shown = format!("{secret:?} {:?}", Some(secret.clone()));
        assert!(!shown.contains("horse"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn short_secrets_are_refused_without_showing_them() {
        let err = JobSecret::new(b"hunter2").unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains("7 bytes") && shown.contains("at least 16"),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn the_secret_comes_from_exactly_one_variable_and_empty_or_unreadable_sources_are_refused() {
        assert!(JobSecret::from_lookup(vars(&[])).unwrap().is_none());
        assert!(JobSecret::from_lookup(vars(&[(SECRET_ENV, TEXT)]))
            .unwrap()
            .is_some());
        let both = JobSecret::from_lookup(vars(&[(SECRET_ENV, TEXT), (SECRET_FILE_ENV, "/x")]))
            .unwrap_err()
            .to_string();
        assert!(both.contains("set only one"), "{both}");
        for name in [SECRET_ENV, SECRET_FILE_ENV] {
            let empty = JobSecret::from_lookup(vars(&[(name, "")]))
                .unwrap_err()
                .to_string();
            assert!(empty.contains(name) && empty.contains("empty"), "{empty}");
        }
        let missing = JobSecret::from_lookup(vars(&[(SECRET_FILE_ENV, "/nonexistent/secret")]))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("/nonexistent/secret"), "{missing}");
    }

    #[test]
    fn files_lose_one_line_break_and_are_capped() {
        let dir = std::env::temp_dir().join(format!("rverbs-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("job.secret");
        let same = |a: &JobSecret, b: &JobSecret| {
            use hmac::Mac;
            let mut x = a.hmac();
            x.update(b"probe");
            let mut y = b.hmac();
            y.update(b"probe");
            x.finalize().into_bytes() == y.finalize().into_bytes()
        };
        let plain = JobSecret::new(TEXT.as_bytes()).unwrap();
        for content in [format!("{TEXT}\n"), format!("{TEXT}\r\n"), TEXT.to_owned()] {
            std::fs::write(&path, content).unwrap();
            assert!(same(&JobSecret::from_file(&path).unwrap(), &plain));
        }
        std::fs::write(&path, format!("{TEXT}\n\n")).unwrap();
        assert!(!same(&JobSecret::from_file(&path).unwrap(), &plain));
        std::fs::write(&path, vec![b'x'; MAX_SECRET_FILE as usize + 1]).unwrap();
        let shown = JobSecret::from_file(&path).unwrap_err().to_string();
        assert!(
            shown.contains(&path.display().to_string()) && shown.contains("more than 4096"),
            "{shown}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
