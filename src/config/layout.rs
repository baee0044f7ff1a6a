//! The launch's layout, typed once: the node count, this node's rank, the rendezvous
//! backend, endpoint, master address and port, run id, workers per node and standalone, each
//! with where its value came from (a flag, a `PET_*` variable, a scheduler, the default).
//!
//! The command line's text is parsed here exactly once ([`Layout::from_args`]); what a
//! scheduler detected arrives typed ([`crate::cluster::Fields`]) and is laid over the values
//! the command line did not type ([`Layout::overlay`], [`Layout::in_place`]). Nothing is
//! written back into [`LaunchArgs`] as text and parsed again: the endpoint rules
//! ([`super::endpoint`]), the worker count and the printed topology ([`super::cluster::plan`])
//! read this struct. A value's [`Origin`] names it in an error (`SLURM_NNODES='0': …`).

use crate::cli::LaunchArgs;
use crate::cluster::{Fields, Sourced};

use super::error::{invalid, ConfigError};
use super::flags::parse_nnodes;
use super::spec::{NodeRange, RdzvBackend};

/// The [`LaunchArgs`] fields this module types (an error about one names its own source).
pub(super) const DESTS: &[&str] = &[
    "nnodes",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "master_addr",
    "master_port",
    "rdzv_id",
    "nproc_per_node",
    "standalone",
];

/// Where a layout value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Origin {
    /// The command line's default (nothing set it).
    Default,
    /// Typed on the command line.
    Flag,
    /// One environment variable: `PET_NNODES`, `SLURM_NNODES`, …
    Var(String),
    /// A scheduler's value that no single variable holds (`hostfile /x`, `in-place`).
    Scheduler(String),
}

impl Origin {
    /// A cluster layer's source text: a variable's name is all capitals, digits and `_`.
    pub(super) fn of_source(source: &str) -> Origin {
        let variable = !source.is_empty()
            && source
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        match variable {
            true => Origin::Var(source.to_string()),
            false => Origin::Scheduler(source.to_string()),
        }
    }

    /// The variable an error about this value names, if one holds it.
    pub(super) fn var(&self) -> Option<String> {
        match self {
            Origin::Var(v) => Some(v.clone()),
            _ => None,
        }
    }

    /// How the printed topology names it: the flag, the variable, the scheduler's text or
    /// `default`.
    pub(super) fn label(&self, flag: &str) -> String {
        match self {
            Origin::Default => "default".into(),
            Origin::Flag => flag.into(),
            Origin::Var(v) | Origin::Scheduler(v) => v.clone(),
        }
    }

    fn typed(&self) -> bool {
        *self == Origin::Flag
    }
}

/// One layout value and its [`Origin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Given<T> {
    pub value: T,
    pub origin: Origin,
}

impl<T> Given<T> {
    /// An [`ConfigError::Invalid`] about this value, naming its variable when one holds it.
    pub(super) fn invalid(
        &self,
        flag: &'static str,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> ConfigError {
        self.attribute(super::error::invalid(flag, value, reason))
    }

    /// `err` (from parsing or resolving this value) naming this value's variable.
    pub(super) fn attribute(&self, err: ConfigError) -> ConfigError {
        err.naming(|_| self.origin.var())
    }
}

/// Where the rendezvous store is, when something named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EndpointSpec {
    /// `--rdzv-endpoint` as typed (an etcd list is several members; the backend's default port
    /// applies to a member without one): parsed by [`super::endpoint`].
    Text(String),
    /// A scheduler's master host and port (none: the backend's default).
    HostPort { host: String, port: Option<u16> },
}

/// The launch's layout, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    pub nnodes: Given<NodeRange>,
    pub node_rank: Given<usize>,
    pub backend: Given<RdzvBackend>,
    /// The backend as named (`etcd` and `etcd-v3` are one backend; messages keep the user's word).
    pub backend_name: String,
    /// `None`: no endpoint named (static: from the master address; c10d/etcd: the default).
    pub endpoint: Option<Given<EndpointSpec>>,
    pub master_addr: Given<String>,
    /// `None`: no port named (static: 29500; standalone: a free port).
    pub master_port: Option<Given<u16>>,
    /// Empty: make one up at launch.
    pub run_id: Given<String>,
    /// `auto`, `cpu`, `gpu` or a count: resolved against the machine by
    /// [`super::flags::resolve_nproc`].
    pub nproc: Given<String>,
    pub standalone: Given<bool>,
}

impl Layout {
    /// The command line's layout (typed flags and `PET_*` values), each text parsed once.
    pub(super) fn from_args(args: &LaunchArgs) -> Result<Layout, ConfigError> {
        let origin = |dest: &str| {
            if args.cli_given.contains(dest) {
                Origin::Flag
            } else if let Some(var) = args.from_env.get(dest) {
                Origin::Var(var.clone())
            } else {
                Origin::Default
            }
        };
        let given = |dest: &str| Given {
            value: (),
            origin: origin(dest),
        };
        let nnodes = Given {
            value: parse_nnodes(&args.nnodes).map_err(|e| given("nnodes").attribute(e))?,
            origin: origin("nnodes"),
        };
        let node_rank = Given {
            value: usize::try_from(args.node_rank).map_err(|_| {
                given("node_rank").invalid(
                    "--node-rank",
                    args.node_rank.to_string(),
                    "must be >= 0",
                )
            })?,
            origin: origin("node_rank"),
        };
        let master_port = match args.master_port {
            None => None,
            Some(p) => Some(Given {
                value: u16::try_from(p).map_err(|_| {
                    given("master_port").invalid(
                        "--master-port",
                        p.to_string(),
                        "must be between 0 and 65535",
                    )
                })?,
                origin: origin("master_port"),
            }),
        };
        let backend = Given {
            value: parse_backend(&args.rdzv_backend)
                .map_err(|e| given("rdzv_backend").attribute(e))?,
            origin: origin("rdzv_backend"),
        };
        let endpoint = (!args.rdzv_endpoint.is_empty()).then(|| Given {
            value: EndpointSpec::Text(args.rdzv_endpoint.clone()),
            origin: origin("rdzv_endpoint"),
        });
        Ok(Layout {
            nnodes,
            node_rank,
            backend,
            backend_name: args.rdzv_backend.clone(),
            endpoint,
            master_addr: Given {
                value: args.master_addr.clone(),
                origin: origin("master_addr"),
            },
            master_port,
            run_id: Given {
                value: args.rdzv_id.clone(),
                origin: origin("rdzv_id"),
            },
            nproc: Given {
                value: args.nproc_per_node.clone(),
                origin: origin("nproc_per_node"),
            },
            standalone: Given {
                value: args.standalone,
                origin: origin("standalone"),
            },
        })
    }

    /// A detected node-mode topology laid over the values the command line did not type.
    pub(super) fn overlay(&mut self, f: &Fields) -> Result<(), ConfigError> {
        if let Some(n) = f.nnodes.as_ref().filter(|_| !self.nnodes.origin.typed()) {
            let origin = Origin::of_source(&n.source);
            if !(0 < n.value.min && n.value.min <= n.value.max) {
                return Err(Given { value: (), origin }.invalid(
                    "--nnodes",
                    n.value.to_string(),
                    "the node counts must satisfy 0 < MIN <= MAX",
                ));
            }
            self.nnodes = Given {
                value: NodeRange {
                    min: n.value.min,
                    max: n.value.max,
                },
                origin,
            };
        }
        if let Some(b) = f.backend.as_ref().filter(|_| !self.backend.origin.typed()) {
            let origin = Origin::of_source(&b.source);
            let value = parse_backend(&b.value).map_err(|e| {
                Given {
                    value: (),
                    origin: origin.clone(),
                }
                .attribute(e)
            })?;
            self.backend = Given { value, origin };
            self.backend_name = b.value.clone();
        }
        // The node rank only means something to the static backend (c10d assigns ranks itself,
        // and warns about a node rank given to it).
        let static_backend = self.backend.value == RdzvBackend::Static;
        if let Some(r) = f.node_rank.as_ref().filter(|_| static_backend) {
            lay(&mut self.node_rank, r);
        }
        if let Some(id) = &f.run_id {
            lay(&mut self.run_id, id);
        }
        if let Some(n) = &f.nproc {
            lay(&mut self.nproc, n);
        }
        if let Some(s) = &f.standalone {
            lay(&mut self.standalone, s);
        }
        let typed_endpoint = self.endpoint.as_ref().is_some_and(|e| e.origin.typed());
        if let (Some(a), false) = (&f.master_addr, typed_endpoint) {
            if static_backend {
                lay(&mut self.master_addr, a);
                if let Some(p) = &f.master_port {
                    if !self.master_port.as_ref().is_some_and(|g| g.origin.typed()) {
                        self.master_port = Some(given_from(p));
                    }
                }
            } else {
                // c10d/etcd: the master is the rendezvous store's host.
                self.endpoint = Some(Given {
                    value: EndpointSpec::HostPort {
                        host: a.value.clone(),
                        port: f.master_port.as_ref().map(|p| p.value),
                    },
                    origin: Origin::of_source(&a.source),
                });
            }
        }
        Ok(())
    }

    /// In-place mode (see [`super::cluster::InPlace`]): a static rendezvous of WORLD_SIZE
    /// members of one worker each, member index RANK, at the scheduler's endpoint. The caller
    /// has refused the flags that would contradict it.
    pub(super) fn in_place(&mut self, rank: &Sourced<usize>, world: &Sourced<usize>, f: &Fields) {
        let scheduler = || Origin::Scheduler("in-place".into());
        self.nnodes = Given {
            value: NodeRange {
                min: world.value,
                max: world.value,
            },
            origin: Origin::of_source(&world.source),
        };
        self.node_rank = given_from(rank);
        if !self.nproc.origin.typed() {
            self.nproc = Given {
                value: "1".into(),
                origin: Origin::Default,
            };
        }
        self.backend = Given {
            value: RdzvBackend::Static,
            origin: scheduler(),
        };
        self.backend_name = "static".into();
        self.standalone = Given {
            value: false,
            origin: scheduler(),
        };
        let typed_endpoint = self.endpoint.as_ref().is_some_and(|e| e.origin.typed());
        if !typed_endpoint {
            if let Some(a) = &f.master_addr {
                lay(&mut self.master_addr, a);
            }
            if let Some(p) = &f.master_port {
                if !self.master_port.as_ref().is_some_and(|g| g.origin.typed()) {
                    self.master_port = Some(given_from(p));
                }
            }
        }
        if !self.run_id.origin.typed() {
            self.run_id = match &f.run_id {
                Some(id) => given_from(id),
                // Every rank must name the same run: the endpoint is the one thing they share.
                None => Given {
                    value: format!(
                        "inplace-{}-{}",
                        self.master_addr.value,
                        self.master_port
                            .as_ref()
                            .map_or(super::spec::DEFAULT_STATIC_MASTER_PORT, |p| p.value)
                    ),
                    origin: scheduler(),
                },
            };
        }
    }
}

fn given_from<T: Clone>(s: &Sourced<T>) -> Given<T> {
    Given {
        value: s.value.clone(),
        origin: Origin::of_source(&s.source),
    }
}

/// `slot` takes the detected value unless the command line typed it.
fn lay<T: Clone>(slot: &mut Given<T>, detected: &Sourced<T>) {
    if !slot.origin.typed() {
        *slot = given_from(detected);
    }
}

/// `--rdzv-backend`.
pub fn parse_backend(text: &str) -> Result<RdzvBackend, ConfigError> {
    match text {
        "static" => Ok(RdzvBackend::Static),
        "c10d" => Ok(RdzvBackend::C10d),
        "etcd-v3" | "etcd" => Ok(RdzvBackend::Etcd),
        "etcd-v2" => Err(invalid(
            "--rdzv-backend",
            text,
            "the etcd v2 API is gone (off by default since etcd 3.4, removed in 3.6); use \
             --rdzv-backend etcd-v3 (alias etcd), which speaks the v3 API",
        )),
        _ => Err(invalid(
            "--rdzv-backend",
            text,
            "unknown rendezvous backend (expected static, c10d, etcd-v3 or etcd)",
        )),
    }
}
