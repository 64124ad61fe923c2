//! `resources`: what one attempt of a job may use on its worker — memory, CPU and processes —
//! written as Kubernetes writes them (`memory: 512Mi`, `cpu: 1.5` or `cpu: 500m`, `pids: 256`).
//!
//! The worker runs each attempt of a process-based executor (`shell`, `python`, a plugin) in a
//! cgroup of its own with these limits, counting the attempt's processes only. Stored and sent
//! in one form each: memory in bytes, CPU in thousandths of a core (millicores), so a reader of
//! the JSON sees numbers.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An attempt's limits; each one absent is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// The most memory its processes may hold together (bytes; `512Mi`, `2G` written). More,
    /// and the kernel's OOM killer ends the attempt (`oom_killed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// How much CPU time its processes get per second of wall time (cores; `1.5`, `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// The most processes and threads it may have at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
}

impl Resources {
    /// Whether it limits nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Whether it sets a limit of `kind`.
    pub fn sets(&self, kind: LimitKind) -> bool {
        match kind {
            LimitKind::Memory => self.memory.is_some(),
            LimitKind::Cpu => self.cpu.is_some(),
            LimitKind::Pids => self.pids.is_some(),
        }
    }

    /// The kinds of limit it sets, in [`LimitKind::ALL`]'s order.
    pub fn kinds(&self) -> impl Iterator<Item = LimitKind> + '_ {
        LimitKind::ALL.into_iter().filter(|kind| self.sets(*kind))
    }
}

/// A kind of limit a job may set and a worker may enforce: the one list the spec, the worker's
/// heartbeat, its refusals and the Router's choice all name limits from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LimitKind {
    /// `memory`.
    Memory,
    /// `cpu`.
    Cpu,
    /// `pids`.
    Pids,
}

impl LimitKind {
    /// Every kind, in the order tables and messages list them.
    pub const ALL: [Self; 3] = [Self::Memory, Self::Cpu, Self::Pids];

    /// Its name, as the spec's field and the heartbeat's list write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Cpu => "cpu",
            Self::Pids => "pids",
        }
    }
}

/// A quantity of memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Memory(pub u64);

/// A share of CPU, in thousandths of a core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cpu(pub u32);

/// The smallest memory limit: below it a process cannot even start.
pub const MIN_MEMORY: Memory = Memory(4 * 1024 * 1024);
/// The smallest CPU limit (10 millicores: the kernel's quota has a floor of 1 ms a period).
pub const MIN_CPU: Cpu = Cpu(10);

impl Memory {
    /// The bytes of `text`: a whole number with an optional suffix, decimal (`k`, `M`, `G`,
    /// `T`, `P`) or binary (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`), as Kubernetes writes quantities.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let digits = text.bytes().take_while(u8::is_ascii_digit).count();
        let (number, suffix) = text.split_at(digits);
        let bad = || {
            format!(
                "`{text}` is not a quantity of memory (a whole number of bytes, or with a unit: \
                 Ki, Mi, Gi, Ti, Pi, or k, M, G, T, P)"
            )
        };
        let number: u64 = number.parse().map_err(|_| bad())?;
        let unit: u64 = match suffix {
            "" => 1,
            "k" => 1000,
            "M" => 1000u64.pow(2),
            "G" => 1000u64.pow(3),
            "T" => 1000u64.pow(4),
            "P" => 1000u64.pow(5),
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            "Pi" => 1 << 50,
            _ => return Err(bad()),
        };
        number
            .checked_mul(unit)
            .map(Self)
            .ok_or_else(|| format!("`{text}` is more memory than can be counted"))
    }
}

impl std::fmt::Display for Memory {
    /// The largest binary unit that writes it whole (`512Mi`), else bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (unit, suffix) in [
            (1u64 << 40, "Ti"),
            (1 << 30, "Gi"),
            (1 << 20, "Mi"),
            (1 << 10, "Ki"),
        ] {
            if self.0 >= unit && self.0.is_multiple_of(unit) {
                return write!(f, "{}{suffix}", self.0 / unit);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Cpu {
    /// The millicores of `text`: cores (`1.5`, at most three decimals) or millicores (`500m`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = || {
            format!("`{text}` is not a share of CPU (cores, as `1.5`, or millicores, as `500m`)")
        };
        if let Some(milli) = text.strip_suffix('m') {
            return milli.parse().map(Self).map_err(|_| bad());
        }
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        if whole.is_empty() && fraction.is_empty()
            || fraction.len() > 3
            || !fraction.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let whole: u32 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| bad())?
        };
        let thousandths: u32 = format!("{fraction:0<3}").parse().map_err(|_| bad())?;
        whole
            .checked_mul(1000)
            .and_then(|m| m.checked_add(thousandths))
            .map(Self)
            .ok_or_else(bad)
    }

    /// The cores it is.
    pub fn cores(self) -> f64 {
        f64::from(self.0) / 1000.0
    }
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

/// A quantity as written: a number, or text with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Whole(u64),
    Number(f64),
    Text(String),
}

impl<'de> Deserialize<'de> for Memory {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Written::deserialize(deserializer)? {
            Written::Whole(bytes) => Ok(Self(bytes)),
            Written::Number(n) => Err(serde::de::Error::custom(format!(
                "`{n}` is not a whole number of bytes (write 1.5Gi as 1536Mi)"
            ))),
            Written::Text(text) => Self::parse(&text).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for Memory {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Cpu {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = match Written::deserialize(deserializer)? {
            Written::Whole(cores) => format!("{cores}"),
            Written::Number(cores) => format!("{cores}"),
            Written::Text(text) => text,
        };
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl Serialize for Cpu {
    /// As cores: a number.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.cores())
    }
}

/// Every problem of `resources` for a job whose executor runs a process (`runs_a_process`),
/// each naming its field.
pub fn problems(resources: &Resources, runs_a_process: bool) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if resources.is_empty() {
        return problems;
    }
    if !runs_a_process {
        problems.push((
            "job.resources",
            "only an executor that runs a process (shell, python, a plugin) can be limited; \
             this one runs inside the worker"
                .to_string(),
        ));
    }
    if let Some(memory) = resources.memory.filter(|m| *m < MIN_MEMORY) {
        problems.push((
            "job.resources.memory",
            format!("{memory} is less than {MIN_MEMORY}: no process starts in it"),
        ));
    }
    if let Some(cpu) = resources.cpu.filter(|c| *c < MIN_CPU) {
        problems.push(("job.resources.cpu", format!("{cpu} is less than {MIN_CPU}")));
    }
    if resources.pids == Some(0) {
        problems.push((
            "job.resources.pids",
            "0 processes: the attempt could not start".to_string(),
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_as_kubernetes_writes_it() {
        assert_eq!(Memory::parse("512Mi"), Ok(Memory(512 << 20)));
        assert_eq!(Memory::parse("2G"), Ok(Memory(2_000_000_000)));
        assert_eq!(Memory::parse("1k"), Ok(Memory(1000)));
        assert_eq!(Memory::parse("65536"), Ok(Memory(65536)));
        for bad in ["", "Mi", "1.5Gi", "12MB", "-1Mi", "1 Mi", "99999999999Pi"] {
            assert!(Memory::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Memory(512 << 20).to_string(), "512Mi");
        assert_eq!(Memory(3 << 30).to_string(), "3Gi");
        assert_eq!(Memory(1000).to_string(), "1000");
    }

    #[test]
    fn cpu_is_cores_or_millicores() {
        assert_eq!(Cpu::parse("1.5"), Ok(Cpu(1500)));
        assert_eq!(Cpu::parse("0.25"), Ok(Cpu(250)));
        assert_eq!(Cpu::parse(".5"), Ok(Cpu(500)));
        assert_eq!(Cpu::parse("2"), Ok(Cpu(2000)));
        assert_eq!(Cpu::parse("500m"), Ok(Cpu(500)));
        for bad in ["", "m", "1.2345", "half", "-1", "1.5m", "."] {
            assert!(Cpu::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Cpu(1500).to_string(), "1500m");
        assert_eq!(Cpu(2000).to_string(), "2");
    }

    #[test]
    fn limits_read_from_yaml_and_json_alike_and_are_stored_as_numbers() {
        let yaml: Resources = serde_saphyr::from_str("{memory: 64Mi, cpu: 0.5, pids: 32}").unwrap();
        let json: Resources =
            serde_json::from_str(r#"{"memory": 67108864, "cpu": "500m", "pids": 32}"#).unwrap();
        assert_eq!(yaml, json);
        assert_eq!(
            serde_json::to_value(yaml).unwrap(),
            serde_json::json!({"memory": 67108864, "cpu": 0.5, "pids": 32})
        );
        let stored: Resources =
            serde_json::from_value(serde_json::to_value(yaml).unwrap()).unwrap();
        assert_eq!(stored, yaml);
        assert!(serde_saphyr::from_str::<Resources>("{memory: 1.5Gi}").is_err());
        assert!(serde_saphyr::from_str::<Resources>("{disk: 1Gi}").is_err());
    }

    #[test]
    fn a_limit_too_small_or_on_an_executor_without_a_process_is_refused() {
        let tiny = Resources {
            memory: Some(Memory(1 << 20)),
            cpu: Some(Cpu(5)),
            pids: Some(0),
        };
        let fields: Vec<_> = problems(&tiny, true).into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "job.resources.memory",
                "job.resources.cpu",
                "job.resources.pids"
            ]
        );
        let fine = Resources {
            memory: Some(MIN_MEMORY),
            ..Resources::default()
        };
        assert!(problems(&fine, true).is_empty());
        assert_eq!(problems(&fine, false)[0].0, "job.resources");
        assert!(problems(&Resources::default(), false).is_empty());
    }
}
