/* placement.h - where a rank's GPU sits on its node: the cores and NUMA node nearest its PCI device (hwloc),
 * so that the rank's threads and its pinned host pool live next to the PCIe link the copies cross. */
#ifndef ZS_PLACEMENT_H
#define ZS_PLACEMENT_H

#include <hwloc.h>
#include <stdbool.h>
#include <stdint.h>

/* "0000:3b:00.0" (lspci) or "00000000:3B:00.0" (cudaDeviceGetPCIBusId): 0, or -EINVAL. */
int zs_place_parse_busid(const char *id, unsigned *domain, unsigned *bus, unsigned *dev, unsigned *func);

/* In topo (loaded with its PCI devices), the PCI device `busid`'s nearest non-I/O ancestor: its cpuset into
 * `cpuset` and the OS index of its first NUMA node into *numa (-1 where it has none). 0, -EINVAL (an id that
 * does not parse), -ENOENT (no such PCI device in topo) or -ENODEV (no ancestor with cores). */
int zs_place_near_pci(hwloc_topology_t topo, const char *busid, hwloc_bitmap_t cpuset, int *numa);

/* The same on this machine's topology (its PCI devices included). */
int zs_place_near_pci_here(const char *busid, hwloc_bitmap_t cpuset, int *numa);

#endif /* ZS_PLACEMENT_H */
