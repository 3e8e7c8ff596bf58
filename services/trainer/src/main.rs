fn main() -> anyhow::Result<()> {
    primus_service::main(
        primus_trainer::SERVICE,
        primus_trainer::ABOUT,
        primus_trainer::default_settings(),
        primus_trainer::run,
    )
}
