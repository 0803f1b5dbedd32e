/* Memory and descriptors per connection of tcp;ofi_rxm, below pyddstore (scripts/conn-memory.sh).
 *   hub M DIR / spokes M DIR: M endpoints (one process) each send the hub one message (M accepted
 *     connections), then the hub answers each over the connection it accepted (no new one):
 *     the hub reports its RSS growth per peer and its descriptors (about one per peer).
 *   sinks M DIR / hubout M DIR: the hub connects out to M endpoints: RSS growth per peer. */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <malloc.h>

#define CHK(x) do { int _r = (int)(x); if (_r) { fprintf(stderr, "%s: %d %s\n", #x, _r, fi_strerror(-_r)); exit(1);} } while (0)
static struct fi_info *info; static struct fid_fabric *fab; static struct fid_domain *dom;
typedef struct { struct fid_ep *ep; struct fid_cq *cq; struct fid_av *av; char name[64]; size_t len; } E;
static long rss_kib(void) { FILE *f = fopen("/proc/self/status", "r"); char l[256]; long v = 0;
  while (fgets(l, sizeof l, f)) if (!strncmp(l, "VmRSS:", 6)) v = atol(l + 6); fclose(f); return v; }
static void init(void) { struct fi_info *h = fi_allocinfo(); h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_TAGGED | FI_MSG | FI_RMA | FI_DIRECTED_RECV; h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->threading = FI_THREAD_SAFE; h->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
  h->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  CHK(fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, h, &info)); CHK(fi_fabric(info->fabric_attr, &fab, NULL));
  CHK(fi_domain(fab, info, &dom, NULL)); }
static void open_ep(E *e) { struct fi_cq_attr ca = {.size = 256, .format = FI_CQ_FORMAT_TAGGED};
  struct fi_av_attr aa = {.type = FI_AV_TABLE}; CHK(fi_cq_open(dom, &ca, &e->cq, NULL));
  CHK(fi_av_open(dom, &aa, &e->av, NULL)); CHK(fi_endpoint(dom, info, &e->ep, NULL));
  CHK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV)); CHK(fi_ep_bind(e->ep, &e->av->fid, 0));
  CHK(fi_enable(e->ep)); e->len = sizeof e->name; CHK(fi_getname(&e->ep->fid, e->name, &e->len)); }
static void wait1(E *e) { struct fi_cq_tagged_entry c; for (;;) { ssize_t r = fi_cq_read(e->cq, &c, 1);
  if (r == 1) return; if (r != -FI_EAGAIN) { struct fi_cq_err_entry er = {0}; fi_cq_readerr(e->cq, &er, 0);
  fprintf(stderr, "cq err %d\n", er.err); exit(1);} } }
static void pollall(E *es, int m) { struct fi_cq_tagged_entry c; for (int i = 0; i < m; i++) fi_cq_read(es[i].cq, &c, 0); }
static fi_addr_t ins(E *e, const void *name) { fi_addr_t a; if (fi_av_insert(e->av, name, 1, &a, 0, NULL) != 1) exit(2); return a; }
static void sendto_(E *e, fi_addr_t a, void *buf, size_t len) { struct fi_context2 ctx;
  while (fi_tsend(e->ep, buf, len, NULL, a, 1, &ctx) == -FI_EAGAIN) { struct fi_cq_tagged_entry c; fi_cq_read(e->cq, &c, 0); } wait1(e); }
static void recv_(E *e, void *buf, size_t len) { struct fi_context2 ctx; CHK(fi_trecv(e->ep, buf, len, NULL, FI_ADDR_UNSPEC, 1, 0, &ctx)); wait1(e); }
int main(int argc, char **argv) {
  const char *mode = argv[1]; int m = atoi(argv[2]); const char *dir = argv[3]; char path[512];
  init();
  if (!strcmp(mode, "hub")) { E h; open_ep(&h); long r0 = rss_kib();
    snprintf(path, sizeof path, "%s/hub.tmp", dir); FILE *f = fopen(path, "wb"); fwrite(h.name, 1, h.len, f); fclose(f);
    char p2[512]; snprintf(p2, sizeof p2, "%s/hub", dir); rename(path, p2);
    char (*names)[64] = calloc(m, 64);
    for (int i = 0; i < m; i++) recv_(&h, names[i], 64);
    malloc_trim(0); long r1 = rss_kib();
    for (int i = 0; i < m; i++) { fi_addr_t a = ins(&h, names[i]); sendto_(&h, a, names[i], 8); }
    malloc_trim(0); long r2 = rss_kib();
    int fds = 0; { FILE *p = popen("ls /proc/self/fd | wc -l", "r"); fscanf(p, "%d", &fds); pclose(p); }
    printf("peers %d rss_start %ld accepted %+ld KiB (%.1f KiB/peer) replied-over-them %+ld KiB (%.1f/peer) fds %d\n",
           m, r0, r1 - r0, (double)(r1 - r0) / m, r2 - r1, (double)(r2 - r1) / m, fds);
    fflush(stdout); snprintf(path, sizeof path, "%s/done", dir); fclose(fopen(path, "w")); sleep(2); return 0; }
  if (!strcmp(mode, "spokes")) { E *es = calloc(m, sizeof(E)); for (int i = 0; i < m; i++) open_ep(&es[i]);
    snprintf(path, sizeof path, "%s/hub", dir); char hub[64]; FILE *f; while (!(f = fopen(path, "rb"))) usleep(10000);
    fread(hub, 1, 64, f); fclose(f);
    for (int i = 0; i < m; i++) { fi_addr_t a = ins(&es[i], hub); char buf[64]; memcpy(buf, es[i].name, 64);
      struct fi_context2 rc; char rb[64]; CHK(fi_trecv(es[i].ep, rb, 64, NULL, FI_ADDR_UNSPEC, 1, 0, &rc));
      sendto_(&es[i], a, buf, 64); }
    snprintf(path, sizeof path, "%s/done", dir);
    while (access(path, F_OK)) { pollall(es, m); usleep(1000); } return 0; }
  /* outbound: hub connects out to m sinks (sinks are spokes that only receive) */
  if (!strcmp(mode, "sinks")) { E *es = calloc(m, sizeof(E)); for (int i = 0; i < m; i++) open_ep(&es[i]);
    snprintf(path, sizeof path, "%s/sinks.tmp", dir); FILE *f = fopen(path, "wb");
    for (int i = 0; i < m; i++) fwrite(es[i].name, 1, 64, f); fclose(f);
    char p2[512]; snprintf(p2, sizeof p2, "%s/sinks", dir); rename(path, p2);
    struct fi_context2 *rc = calloc(m, sizeof *rc); char (*rb)[64] = calloc(m, 64);
    for (int i = 0; i < m; i++) CHK(fi_trecv(es[i].ep, rb[i], 64, NULL, FI_ADDR_UNSPEC, 1, 0, &rc[i]));
    snprintf(path, sizeof path, "%s/done", dir);
    while (access(path, F_OK)) { pollall(es, m); usleep(1000); } return 0; }
  if (!strcmp(mode, "hubout")) { E h; open_ep(&h); snprintf(path, sizeof path, "%s/sinks", dir);
    while (access(path, F_OK)) usleep(10000);
    char (*names)[64] = calloc(m, 64); FILE *f = fopen(path, "rb"); fread(names, 64, m, f); fclose(f);
    malloc_trim(0); long r0 = rss_kib();
    for (int i = 0; i < m; i++) { fi_addr_t a = ins(&h, names[i]); char b[8] = {0}; sendto_(&h, a, b, 8); }
    malloc_trim(0); long r1 = rss_kib();
    printf("peers %d outbound %+ld KiB (%.1f KiB/peer)\n", m, r1 - r0, (double)(r1 - r0) / m);
    fflush(stdout); snprintf(path, sizeof path, "%s/done", dir); fclose(fopen(path, "w")); sleep(2); return 0; }
  return 1; }
