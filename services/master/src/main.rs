fn main() -> anyhow::Result<()> {
    primus_service::main_with_flags(
        primus_master::SERVICE,
        primus_master::ABOUT,
        primus_master::default_settings(),
        primus_master::FLAGS,
        primus_master::run,
    )
}
