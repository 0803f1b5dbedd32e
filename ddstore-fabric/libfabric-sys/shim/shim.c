/* See shim.h: one forwarding function per static inline libfabric call. */
#include "shim.h"

struct fi_info *ddfi_allocinfo(void) { return fi_allocinfo(); }
int ddfi_close(struct fid *fid) { return fi_close(fid); }
int ddfi_control(struct fid *fid, int command, void *arg)
{
	return fi_control(fid, command, arg);
}

int ddfi_domain(struct fid_fabric *fabric, struct fi_info *info,
		struct fid_domain **domain, void *context)
{
	return fi_domain(fabric, info, domain, context);
}

int ddfi_endpoint(struct fid_domain *domain, struct fi_info *info,
		  struct fid_ep **ep, void *context)
{
	return fi_endpoint(domain, info, ep, context);
}

int ddfi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
		 struct fid_av **av, void *context)
{
	return fi_av_open(domain, attr, av, context);
}

int ddfi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
		 struct fid_cq **cq, void *context)
{
	return fi_cq_open(domain, attr, cq, context);
}

int ddfi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags)
{
	return fi_ep_bind(ep, bfid, flags);
}

int ddfi_enable(struct fid_ep *ep) { return fi_enable(ep); }

ssize_t ddfi_cancel(struct fid *fid, void *context)
{
	return fi_cancel(fid, context);
}

int ddfi_getname(struct fid *fid, void *addr, size_t *addrlen)
{
	return fi_getname(fid, addr, addrlen);
}

int ddfi_av_insert(struct fid_av *av, const void *addr, size_t count,
		   fi_addr_t *fi_addr, uint64_t flags, void *context)
{
	return fi_av_insert(av, addr, count, fi_addr, flags, context);
}

int ddfi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
		uint64_t access, uint64_t offset, uint64_t requested_key,
		uint64_t flags, struct fid_mr **mr, void *context)
{
	return fi_mr_reg(domain, buf, len, access, offset, requested_key,
			 flags, mr, context);
}

int ddfi_mr_regattr(struct fid_domain *domain, const struct fi_mr_attr *attr,
		    uint64_t flags, struct fid_mr **mr)
{
	return fi_mr_regattr(domain, attr, flags, mr);
}

uint64_t ddfi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
void *ddfi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }

int ddfi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags)
{
	return fi_mr_bind(mr, bfid, flags);
}

int ddfi_mr_enable(struct fid_mr *mr) { return fi_mr_enable(mr); }

ssize_t ddfi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
		  fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context)
{
	return fi_read(ep, buf, len, desc, src_addr, addr, key, context);
}

int ddfi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count,
		   uint64_t flags)
{
	return fi_av_remove(av, fi_addr, count, flags);
}

ssize_t ddfi_trecvv(struct fid_ep *ep, const struct iovec *iov, void **desc,
		    size_t count, fi_addr_t src_addr, uint64_t tag,
		    uint64_t ignore, void *context)
{
	return fi_trecvv(ep, iov, desc, count, src_addr, tag, ignore, context);
}

ssize_t ddfi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc,
		   fi_addr_t src_addr, uint64_t tag, uint64_t ignore,
		   void *context)
{
	return fi_trecv(ep, buf, len, desc, src_addr, tag, ignore, context);
}

ssize_t ddfi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		   fi_addr_t dest_addr, uint64_t tag, void *context)
{
	return fi_tsend(ep, buf, len, desc, dest_addr, tag, context);
}

ssize_t ddfi_tsendv(struct fid_ep *ep, const struct iovec *iov, void **desc,
		    size_t count, fi_addr_t dest_addr, uint64_t tag,
		    void *context)
{
	return fi_tsendv(ep, iov, desc, count, dest_addr, tag, context);
}

/* A tagged send of an iov whose completion at the receiver carries `data`
 * (remote CQ data). FI_COMPLETION: the flags passed replace the endpoint's. */
ssize_t ddfi_tsendv_data(struct fid_ep *ep, const struct iovec *iov,
			 void **desc, size_t count, fi_addr_t dest_addr,
			 uint64_t data, uint64_t tag, void *context)
{
	struct fi_msg_tagged msg = {
		.msg_iov = iov,
		.desc = desc,
		.iov_count = count,
		.addr = dest_addr,
		.tag = tag,
		.ignore = 0,
		.context = context,
		.data = data,
	};
	return fi_tsendmsg(ep, &msg, FI_REMOTE_CQ_DATA | FI_COMPLETION);
}

ssize_t ddfi_cq_read(struct fid_cq *cq, void *buf, size_t count)
{
	return fi_cq_read(cq, buf, count);
}

ssize_t ddfi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
			uint64_t flags)
{
	return fi_cq_readerr(cq, buf, flags);
}

ssize_t ddfi_cq_sread(struct fid_cq *cq, void *buf, size_t count,
		      const void *cond, int timeout)
{
	return fi_cq_sread(cq, buf, count, cond, timeout);
}

int ddfi_cq_signal(struct fid_cq *cq) { return fi_cq_signal(cq); }

const char *ddfi_cq_strerror(struct fid_cq *cq, int prov_errno,
			     const void *err_data, char *buf, size_t len)
{
	return fi_cq_strerror(cq, prov_errno, err_data, buf, len);
}
