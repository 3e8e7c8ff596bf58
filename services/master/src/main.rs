fn main() -> anyhow::Result<()> {
    primus_service::main(
        primus_master::SERVICE,
        primus_master::ABOUT,
        primus_master::default_settings(),
        primus_master::run,
    )
}
