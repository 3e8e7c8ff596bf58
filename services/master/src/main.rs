// The planner allocates a string per listed file on tokio workers and frees it on another
// thread; with glibc's allocator parallel windows were slower than one at a time, with
// mimalloc they scale (cargo bench -p primus-benches --bench dtgg).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    primus_service::main_with_flags(
        primus_master::SERVICE,
        primus_master::ABOUT,
        primus_master::default_settings(),
        primus_master::FLAGS,
        primus_master::run,
    )
}
