//! Which ranks of a job share a node: every rank's [`HostIdentity`] and whether it has
//! InfiniBand, gathered once through the bootstrap ([`Hosts::gather`]). From it follow the
//! decisions that depend on placement: whether peer memory can be mapped at all
//! ([`Hosts::single_node`]) and the transport to each peer ([`Hosts::transport`], the same
//! on both ends of every pair because both ends decide from the same gathered facts).
//!
//! [`SEPARATE_HOSTS_VAR`](crate::registered_memory::SEPARATE_HOSTS_VAR) makes every
//! process its own node, so one machine runs the multi-node paths.

use oxccl_hal::{Error, Result};

use crate::bootstrap::Bootstrap;
use crate::connection::{choose_transport, ib, Transport};
use crate::registered_memory::{HostIdentity, Reader};

/// Every rank's node and InfiniBand presence (index = rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hosts {
    rank: u32,
    hosts: Vec<HostIdentity>,
    ib: Vec<bool>,
}

impl Hosts {
    /// Gathers every rank's identity and InfiniBand presence (collective: one all-gather).
    pub fn gather(bootstrap: &Bootstrap) -> Result<Hosts> {
        let rank = bootstrap.rank();
        let mut mine = Vec::new();
        HostIdentity::local()?.encode(&mut mine);
        mine.push(u8::from(ib::available()));
        let all = bootstrap.all_gather(&mine)?;
        let mut hosts = Vec::with_capacity(all.len());
        let mut ib = Vec::with_capacity(all.len());
        for bytes in &all {
            let mut r = Reader::new(bytes, "host identity");
            hosts.push(HostIdentity::decode(&mut r)?);
            ib.push(r.u8()? != 0);
            r.finish()?;
        }
        Hosts::new(rank, hosts, ib)
    }

    /// From known facts (tests, tools): `hosts[r]` and `ib[r]` are rank r's.
    pub fn new(rank: u32, hosts: Vec<HostIdentity>, ib: Vec<bool>) -> Result<Hosts> {
        if hosts.len() != ib.len() || rank as usize >= hosts.len() {
            return Err(Error::InvalidArgument(format!(
                "host map of {} identities and {} InfiniBand flags for rank {rank}",
                hosts.len(),
                ib.len()
            )));
        }
        Ok(Hosts { rank, hosts, ib })
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.hosts.len() as u32
    }

    /// Rank `r`'s node (`None` past the world size).
    pub fn host(&self, r: u32) -> Option<&HostIdentity> {
        self.hosts.get(r as usize)
    }

    /// Whether every rank is on this rank's node (so peer memory can be mapped). Unknown
    /// identities count as other nodes.
    pub fn single_node(&self) -> bool {
        let me = &self.hosts[self.rank as usize];
        self.hosts
            .iter()
            .enumerate()
            .all(|(r, h)| r == self.rank as usize || me.same_node(h))
    }

    /// The transport to `peer` ([`choose_transport`]: IPC on this node, else InfiniBand
    /// where both ends have it, else TCP), or `forced` where given; `None` for this rank
    /// and past the world size.
    pub fn transport(&self, peer: u32, forced: Option<Transport>) -> Option<Transport> {
        if peer == self.rank {
            return None;
        }
        let there = self.hosts.get(peer as usize)?;
        let me = self.rank as usize;
        let ib = self.ib[me] && self.ib[peer as usize];
        Some(forced.unwrap_or_else(|| choose_transport(&self.hosts[me], there, ib)))
    }

    /// [`Hosts::transport`] of every rank (index = rank).
    pub fn transports(&self, forced: Option<Transport>) -> Vec<Option<Transport>> {
        (0..self.world_size())
            .map(|p| self.transport(p, forced))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registered_memory::separate_hosts;

    fn node(name: &str) -> HostIdentity {
        HostIdentity {
            hostname: name.into(),
            boot_id: "boot".into(),
        }
    }

    #[test]
    fn transports_follow_the_nodes_and_infiniband() {
        let a = node("a");
        let hosts = Hosts::new(
            0,
            vec![a.clone(), a.clone(), node("b"), node("c")],
            vec![true, true, true, false],
        )
        .unwrap();
        assert!(!hosts.single_node());
        assert_eq!(
            hosts.transports(None),
            vec![
                None,
                Some(Transport::Ipc),
                Some(Transport::Ib),
                Some(Transport::Tcp)
            ]
        );
        assert_eq!(hosts.transport(3, Some(Transport::Ib)), Some(Transport::Ib));
        assert_eq!(hosts.transport(4, None), None);
        let one = Hosts::new(1, vec![a.clone(), a.clone()], vec![false; 2]).unwrap();
        assert!(one.single_node());
        assert!(Hosts::new(2, vec![a.clone()], vec![false]).is_err());
        assert!(Hosts::new(0, vec![a], vec![]).is_err());
    }

    #[test]
    fn separated_identities_are_other_nodes() {
        let a = node("a");
        let (p, q) = (a.separated(10), a.separated(11));
        assert!(!p.same_node(&q) && !p.same_node(&a));
        assert!(p.same_node(&a.separated(10)));
        let hosts = Hosts::new(0, vec![p, q], vec![false, false]).unwrap();
        assert!(!hosts.single_node());
        assert_eq!(hosts.transport(1, None), Some(Transport::Tcp));
        // Unknown stays unknown (never equal to anything).
        assert!(node("").separated(3).hostname.is_empty());
    }

    #[test]
    fn the_switch_takes_0_or_1_only() {
        assert_eq!(separate_hosts(None), Ok(false));
        assert_eq!(separate_hosts(Some(" ")), Ok(false));
        assert_eq!(separate_hosts(Some("0")), Ok(false));
        assert_eq!(separate_hosts(Some(" 1 ")), Ok(true));
        for bad in ["yes", "2", "true", "on"] {
            let e = separate_hosts(Some(bad)).unwrap_err();
            assert!(e.contains("OXCCL_SEPARATE_HOSTS") && e.contains(bad), "{e}");
        }
    }
}
