/* placement.c - from a GPU's PCI bus id to the cores and NUMA node nearest it (hwloc), on a topology given
 * (so a test can hand it one written in XML) or on this machine's. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "placement.h"

int zs_place_parse_busid(const char *id, unsigned *domain, unsigned *bus, unsigned *dev, unsigned *func)
{
    int end = 0;

    /* hex digits and separators only: sscanf's %x would also take a sign, blanks or a "0x" */
    if (!id || strspn(id, "0123456789abcdefABCDEF:.") != strlen(id) ||
        sscanf(id, "%x:%x:%x.%x%n", domain, bus, dev, func, &end) != 4 || id[end] != '\0' || *bus > 0xff ||
        *dev > 0x1f || *func > 7)
        return -EINVAL;
    return 0;
}

int zs_place_near_pci(hwloc_topology_t topo, const char *busid, hwloc_bitmap_t cpuset, int *numa)
{
    unsigned dom, bus, dev, func;
    hwloc_obj_t pci, anc;

    *numa = -1;
    if (zs_place_parse_busid(busid, &dom, &bus, &dev, &func))
        return -EINVAL;
    pci = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, func);
    if (!pci)
        return -ENOENT;
    /* I/O objects hang off the first ordinary object (package, NUMA group, machine) their bus leads to */
    anc = hwloc_get_non_io_ancestor_obj(topo, pci);
    if (!anc || !anc->cpuset || hwloc_bitmap_iszero(anc->cpuset))
        return -ENODEV;
    hwloc_bitmap_copy(cpuset, anc->cpuset);
    if (anc->nodeset && !hwloc_bitmap_iszero(anc->nodeset))
        *numa = hwloc_bitmap_first(anc->nodeset);
    return 0;
}

int zs_place_near_pci_here(const char *busid, hwloc_bitmap_t cpuset, int *numa)
{
    hwloc_topology_t topo;
    int rc;

    *numa = -1;
    if (hwloc_topology_init(&topo))
        return -ENOMEM;
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    rc = hwloc_topology_load(topo) ? -ENODEV : zs_place_near_pci(topo, busid, cpuset, numa);
    hwloc_topology_destroy(topo);
    return rc;
}
