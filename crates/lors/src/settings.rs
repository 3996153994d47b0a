//! Settings every tool resolves the same way, once, before it starts:
//! command-line flag > `lors://` URI > environment > `~/.xndrc` > default.
//!
//! The environment variables are those of "IBP Deployment Tests and Integration with DiDaS Project" §5 (`LORS_BLOCKSIZE` in
//! megabytes, `LORS_DURATION` and `LORS_TIMEOUT` in seconds unless a unit is
//! given, `LORS_COPIES`, `LORS_THREADS`, `LBONE_SERVER`, `LBONE_PORT`) plus
//! `LORS_LOCATION` and `LORS_MAXDEPOTS` for the `.xndrc` keywords of the
//! same names.
//!
//! **One timeout policy.** [`Settings::timeout`] is how long any network
//! operation of any command may go without progress: no byte sent or
//! received, no reply line, for that long means the depot (or L-Bone) is
//! gone. It is also the server-side timeout sent in every request, and a
//! connection attempt waits at most 10 s of it. A depot-to-depot copy (SEND)
//! answers only when the whole copy is done, so its reply is awaited longer
//! in proportion to its length (see [`lors_ibp::client::copy_reply_deadline`]).
//!
//! ```
//! use std::time::Duration;
//! use lors::settings::{Env, Layer, Settings};
//! use lors::uri::ExnodeRef;
//!
//! let rc = lors::xndrc::parse("TIMEOUT 30\nCOPIES 2\nTHREADS 4\n").unwrap();
//! let env = Env::from_pairs([("LORS_COPIES", "3")]);
//! let uri = ExnodeRef::parse("lors:///x.xnd?copies=5").unwrap();
//! let flags = Layer { threads: Some(16), ..Layer::default() };
//! let s = Settings::resolve(flags, Some(&uri), &env, rc).unwrap();
//! assert_eq!(s.threads, Some(16));                      // the flag
//! assert_eq!(s.copies, Some(5));                        // the URI beats the environment
//! assert_eq!(s.timeout, Duration::from_secs(30));       // ~/.xndrc
//! assert_eq!(s.duration, lors::settings::DEFAULT_DURATION);
//! ```

use std::time::Duration;

use lors_exnode::erasure::Scheme;
use lors_ibp::ClientConfig;
use lors_ibp::proto::{Reliability, Timeout};
use lors_ibp::units::{parse_block_size, parse_duration};
use lors_lbone::client::Directory;

use crate::uri::ExnodeRef;
use crate::xndrc::Xndrc;

/// The network timeout when nothing sets one: a minute without progress.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The lease of new allocations when nothing sets one.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(86_400);

/// The environment variables read, in the order `lors --help` lists them.
pub const ENV_VARS: [&str; 10] = [
    "LORS_TIMEOUT",
    "LORS_BLOCKSIZE",
    "LORS_THREADS",
    "LORS_COPIES",
    "LORS_EC",
    "LORS_DURATION",
    "LORS_LOCATION",
    "LORS_MAXDEPOTS",
    "LBONE_SERVER",
    "LBONE_PORT",
];

/// A value that could not be used, and where it came from.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// An environment variable with a value that does not parse.
    #[error("environment variable {name}={value:?}: {why}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// The L-Bone named by a flag, the URI or the environment.
    #[error("{0}")]
    Lbone(lors_lbone::client::Error),
    /// A value outside what the tools accept, from whichever source.
    #[error("{0}")]
    Invalid(String),
}

/// The environment variables that matter here, read once (a snapshot, so
/// tests and libraries can pass their own).
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: Vec<(&'static str, String)>,
}

impl Env {
    /// The process environment's values of [`ENV_VARS`] (empty ones are
    /// unset, as a shell's `LORS_COPIES= lors …` means).
    pub fn process() -> Env {
        Env {
            vars: ENV_VARS
                .iter()
                .filter_map(|&n| std::env::var(n).ok().map(|v| (n, v)))
                .filter(|(_, v)| !v.trim().is_empty())
                .collect(),
        }
    }

    /// Given values; names not in [`ENV_VARS`] are ignored.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Env {
        Env {
            vars: pairs
                .into_iter()
                .filter_map(|(n, v)| {
                    let name = ENV_VARS.iter().find(|&&k| k == n)?;
                    Some((*name, v.to_owned()))
                })
                .collect(),
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.trim())
    }
}

/// What one source (flags, URI, environment, file) sets; `None` = not set
/// there, so the next source down decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layer {
    /// Network timeout (`-T`, `timeout=`, `LORS_TIMEOUT`, `TIMEOUT`).
    pub timeout: Option<Duration>,
    /// Block size (`-b`, `bs=`, `LORS_BLOCKSIZE`, `DATA_BLOCKSIZE`).
    pub block_size: Option<u64>,
    /// Transfers at once (`-t`, `threads=`, `LORS_THREADS`, `THREADS`).
    pub threads: Option<usize>,
    /// Copies of each block (`-c`, `copies=`, `LORS_COPIES`, `COPIES`).
    pub copies: Option<usize>,
    /// Erasure code of new uploads (`--ec`, `ec=`, `LORS_EC`, `EC`);
    /// `Some(None)`: copies. A source that sets copies and no code says
    /// copies: the highest source that says either decides.
    pub ec: Option<Option<Scheme>>,
    /// Lease of new allocations (`-d`, `duration=`, `LORS_DURATION`,
    /// `DURATION`).
    pub duration: Option<Duration>,
    /// Hard (`true`) or soft storage (`-s`, `STORAGE_TYPE`).
    pub hard: Option<bool>,
    /// L-Bone location hint (`-l`, `LORS_LOCATION`, `LOCATION`).
    pub location: Option<String>,
    /// Depots to ask the L-Bone for (`--max-depots`, `LORS_MAXDEPOTS`,
    /// `MAXDEPOTS`).
    pub max_depots: Option<usize>,
    /// The L-Bone (`-H`, the URI's authority, `LBONE_SERVER`). The file's
    /// `LBONE_SERVER` lines are a fail-over list and stay in [`Settings::rc`].
    pub lbone: Option<LboneAt>,
    /// Port of a legacy L-Bone given as a bare host (`-P`, `LBONE_PORT`).
    pub lbone_port: Option<u16>,
}

impl Layer {
    /// What a `lors://` URI sets.
    pub fn from_uri(u: &ExnodeRef) -> Layer {
        Layer {
            timeout: u.timeout,
            block_size: u.block_size,
            threads: u.threads,
            copies: u.copies,
            ec: u.ec.or(u.copies.map(|_| None)),
            duration: u.duration,
            // HOST:PORT as `-H` takes it: the legacy protocol on its own
            // port (the default), else HTTP if spoken there.
            lbone: u.lbone.as_ref().map(|(h, p)| match h.contains(':') {
                true => LboneAt::Legacy(h.clone(), *p),
                false => LboneAt::Named(format!("{h}:{p}")),
            }),
            ..Layer::default()
        }
    }

    /// What the environment sets. Numbers without a unit mean what "IBP Deployment Tests and Integration with DiDaS Project"
    /// says: megabytes for `LORS_BLOCKSIZE`, seconds for the durations.
    pub fn from_env(env: &Env) -> Result<Layer, SettingsError> {
        fn parse<T>(
            env: &Env,
            name: &'static str,
            f: impl Fn(&str) -> Result<T, String>,
        ) -> Result<Option<T>, SettingsError> {
            env.get(name)
                .map(|v| {
                    f(v).map_err(|why| SettingsError::Env {
                        name,
                        value: v.to_owned(),
                        why,
                    })
                })
                .transpose()
        }
        let secs = |v: &str| {
            if v.bytes().all(|b| b.is_ascii_digit()) {
                parse_duration(&format!("{v}s"))
            } else {
                parse_duration(v)
            }
        };
        let count = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| "expected a number".to_owned())
        };
        Ok(Layer {
            timeout: parse(env, "LORS_TIMEOUT", secs)?,
            block_size: parse(env, "LORS_BLOCKSIZE", parse_block_size)?,
            threads: parse(env, "LORS_THREADS", count)?,
            copies: parse(env, "LORS_COPIES", count)?,
            ec: match parse(env, "LORS_EC", crate::uri::parse_ec)? {
                None if env.get("LORS_COPIES").is_some() => Some(None),
                ec => ec,
            },
            duration: parse(env, "LORS_DURATION", secs)?,
            hard: None,
            location: env.get("LORS_LOCATION").map(str::to_owned),
            max_depots: parse(env, "LORS_MAXDEPOTS", count)?,
            lbone: env
                .get("LBONE_SERVER")
                .map(|s| LboneAt::Named(s.to_owned())),
            lbone_port: parse(env, "LBONE_PORT", |v| {
                v.parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| "expected a port number".to_owned())
            })?,
        })
    }

    /// What a settings file sets (its lists stay in [`Settings::rc`]).
    pub fn from_xndrc(rc: &Xndrc) -> Layer {
        Layer {
            timeout: rc.timeout,
            block_size: rc.block_size,
            threads: rc.threads,
            copies: rc.copies,
            ec: rc.ec,
            duration: rc.duration,
            hard: rc.hard,
            location: rc.location.clone(),
            max_depots: rc.max_depots,
            lbone: None,
            lbone_port: None,
        }
    }

    /// Each value from `self`, else from `lower`.
    pub fn or(self, lower: Layer) -> Layer {
        Layer {
            timeout: self.timeout.or(lower.timeout),
            block_size: self.block_size.or(lower.block_size),
            threads: self.threads.or(lower.threads),
            copies: self.copies.or(lower.copies),
            ec: self.ec.or(lower.ec),
            duration: self.duration.or(lower.duration),
            hard: self.hard.or(lower.hard),
            location: self.location.or(lower.location),
            max_depots: self.max_depots.or(lower.max_depots),
            lbone: self.lbone.or(lower.lbone),
            lbone_port: self.lbone_port.or(lower.lbone_port),
        }
    }
}

/// How a source names an L-Bone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LboneAt {
    /// As a user writes it (`-H`, `LBONE_SERVER`): a host (legacy protocol
    /// on the `-P`/`LBONE_PORT` port), `HOST:PORT` or an `http://` URL; see
    /// [`Directory::parse`].
    Named(String),
    /// The authority of a `lors://HOST[:PORT]` URI: the legacy protocol,
    /// as "IBP Deployment Tests and Integration with DiDaS Project"'s tools speak it.
    Legacy(String, u16),
}

/// The resolved settings of one command. Values whose default differs by
/// command (block size, threads, copies) stay `None` when nothing set them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long any network operation may go without progress.
    pub timeout: Duration,
    /// Block size, if any source set one.
    pub block_size: Option<u64>,
    /// Transfers at once, if any source set it.
    pub threads: Option<usize>,
    /// Copies of each block, if any source set it.
    pub copies: Option<usize>,
    /// The erasure code new uploads use instead of copies, if the highest
    /// source to say either chose one.
    pub erasure: Option<Scheme>,
    /// Lease of new allocations.
    pub duration: Duration,
    /// Hard storage (the default) or soft.
    pub reliability: Reliability,
    /// L-Bone location hint (empty = none).
    pub location: String,
    /// Depots to ask the L-Bone for, if any source set it.
    pub max_depots: Option<usize>,
    /// The L-Bone named by a flag, the URI or the environment (its
    /// protocol not yet probed: see [`Directory::resolve`]).
    pub lbone: Option<Directory>,
    /// The settings file, for its lists (`DEPOT`, `LBONE_SERVER`,
    /// `ROUTE_DEPOT`) and e2e settings.
    pub rc: Xndrc,
}

impl Settings {
    /// Resolves `flags` > `uri` > `env` > `rc` > defaults.
    pub fn resolve(
        flags: Layer,
        uri: Option<&ExnodeRef>,
        env: &Env,
        rc: Xndrc,
    ) -> Result<Settings, SettingsError> {
        let l = flags
            .or(uri.map(Layer::from_uri).unwrap_or_default())
            .or(Layer::from_env(env)?)
            .or(Layer::from_xndrc(&rc));
        let lbone = match &l.lbone {
            None => None,
            Some(LboneAt::Legacy(h, p)) => Some(Directory::Legacy(h.clone(), *p)),
            Some(LboneAt::Named(s)) => {
                Some(Directory::parse(s, l.lbone_port).map_err(SettingsError::Lbone)?)
            }
        };
        let timeout = l.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            return Err(SettingsError::Invalid(
                "a timeout of 0 would fail every operation: give at least 1s".into(),
            ));
        }
        if let Some(c) = l.copies
            && !(1..=1000).contains(&c)
        {
            return Err(SettingsError::Invalid(format!(
                "{c} copies: give between 1 and 1000"
            )));
        }
        if l.threads == Some(0) {
            return Err(SettingsError::Invalid("0 threads: give at least 1".into()));
        }
        Ok(Settings {
            timeout,
            block_size: l.block_size,
            threads: l.threads,
            copies: l.copies,
            erasure: l.ec.flatten(),
            duration: l.duration.unwrap_or(DEFAULT_DURATION),
            reliability: if l.hard.unwrap_or(true) {
                Reliability::Hard
            } else {
                Reliability::Soft
            },
            location: l.location.unwrap_or_default(),
            max_depots: l.max_depots,
            lbone,
            rc,
        })
    }

    /// The L-Bone these settings name, if any, with its protocol settled
    /// once (a `HOST:PORT` is probed here, not again by each later query
    /// and rate report).
    pub async fn directory(&self) -> Option<Directory> {
        match &self.lbone {
            Some(d) => Some(d.resolve().await),
            None => None,
        }
    }

    /// Depots for `copies` of allocations of `bytes` for these settings'
    /// lease, location and depot count: `explicit` if any, else as
    /// [`crate::directory::find_depots`] finds them through `named` (an
    /// L-Bone from [`Settings::directory`]) or `~/.xndrc`, leaving out
    /// `exclude`.
    pub async fn find_depots(
        &self,
        explicit: &[String],
        named: Option<Directory>,
        copies: usize,
        bytes: u64,
        exclude: Vec<String>,
    ) -> Result<crate::directory::Found, crate::directory::DirectoryError> {
        use crate::directory::{Wanted, depot_count, find_depots};
        let want = Wanted {
            count: depot_count(self.max_depots, copies, &self.location),
            bytes,
            secs: self.duration.as_secs(),
            location: self.location.clone(),
            exclude,
        };
        find_depots(explicit, named, &self.rc, &want).await
    }

    /// The IBP client settings of the timeout policy: [`Self::timeout`]
    /// without progress gives a depot up, and is the server-side timeout
    /// every request carries; connecting waits at most 10 s of it.
    pub fn client(&self) -> ClientConfig {
        ClientConfig {
            server_timeout: Timeout::Secs(
                u32::try_from(self.timeout.as_secs().max(1)).unwrap_or(u32::MAX),
            ),
            ..ClientConfig::with_io_timeout(self.timeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc(text: &str) -> Xndrc {
        crate::xndrc::parse(text).unwrap()
    }

    #[test]
    fn each_source_beats_the_ones_below_it() {
        let file = rc(
            "TIMEOUT 30\nCOPIES 2\nTHREADS 4\nDATA_BLOCKSIZE 5M\nDURATION 2h\nLOCATION city= Oslo\n",
        );
        let env = Env::from_pairs([
            ("LORS_COPIES", "3"),
            ("LORS_THREADS", "6"),
            ("LORS_BLOCKSIZE", "7"),
            ("LORS_TIMEOUT", "40"),
        ]);
        let uri = ExnodeRef::parse("lors:///x.xnd?copies=5&threads=8").unwrap();
        let flags = Layer {
            threads: Some(16),
            ..Layer::default()
        };
        let s = Settings::resolve(flags, Some(&uri), &env, file).unwrap();
        assert_eq!(s.threads, Some(16), "flag");
        assert_eq!(s.copies, Some(5), "URI over environment");
        assert_eq!(
            s.block_size,
            Some(7 << 20),
            "environment (megabytes) over file"
        );
        assert_eq!(s.timeout, Duration::from_secs(40), "environment (seconds)");
        assert_eq!(s.duration, Duration::from_secs(7200), "file");
        assert_eq!(s.location, "city= Oslo", "file");
        assert_eq!(s.reliability, Reliability::Hard, "default");
        assert_eq!(s.max_depots, None);
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let s =
            Settings::resolve(Layer::default(), None, &Env::default(), Xndrc::default()).unwrap();
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.duration, DEFAULT_DURATION);
        assert!(s.lbone.is_none() && s.copies.is_none() && s.location.is_empty());
        let c = s.client();
        assert_eq!(c.io_timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.server_timeout, Timeout::Secs(60));
        assert!(c.connect_timeout <= Duration::from_secs(10));
    }

    #[test]
    fn one_timeout_drives_the_whole_client() {
        let flags = Layer {
            timeout: Some(Duration::from_secs(5)),
            ..Layer::default()
        };
        let c = Settings::resolve(flags, None, &Env::default(), Xndrc::default())
            .unwrap()
            .client();
        assert_eq!(c.io_timeout, Duration::from_secs(5));
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.server_timeout, Timeout::Secs(5));
    }

    #[test]
    fn the_lbone_comes_with_its_own_port() {
        let env = Env::from_pairs([("LBONE_SERVER", "envhost"), ("LBONE_PORT", "7000")]);
        // The environment's host takes the environment's port.
        let s = Settings::resolve(Layer::default(), None, &env, Xndrc::default()).unwrap();
        assert_eq!(s.lbone, Some(Directory::Legacy("envhost".into(), 7000)));
        // A URI's host beats the environment's, with the URI's port.
        let uri = ExnodeRef::parse("lors://urihost/x.xnd").unwrap();
        let s = Settings::resolve(Layer::default(), Some(&uri), &env, Xndrc::default()).unwrap();
        assert_eq!(s.lbone, Some(Directory::Legacy("urihost".into(), 6767)));
        // A flag's host beats both; -P (or else LBONE_PORT) is its port.
        let flags = Layer {
            lbone: Some(LboneAt::Named("flaghost".into())),
            ..Layer::default()
        };
        let s = Settings::resolve(flags, Some(&uri), &env, Xndrc::default()).unwrap();
        assert_eq!(s.lbone, Some(Directory::Legacy("flaghost".into(), 7000)));
    }

    #[test]
    fn bad_values_say_where_they_came_from() {
        let env = Env::from_pairs([("LORS_THREADS", "many")]);
        let e = Settings::resolve(Layer::default(), None, &env, Xndrc::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "environment variable LORS_THREADS=\"many\": expected a number"
        );
        let flags = Layer {
            timeout: Some(Duration::ZERO),
            ..Layer::default()
        };
        let e = Settings::resolve(flags, None, &Env::default(), Xndrc::default()).unwrap_err();
        assert!(e.to_string().contains("at least 1s"), "{e}");
        // Names not ours are not read.
        assert!(Env::from_pairs([("PATH", "/bin")]).vars.is_empty());
    }
}
